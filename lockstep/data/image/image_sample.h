// ImageSample: one example on its way through the transforms, decoded late.
//
// It starts as an encoded file and its header. Crops only narrow the region
// still to be decoded; a resize to a smaller size decodes the region at the
// smallest JPEG scale (1/2, 1/4, 1/8) that still holds the output, the
// choice Pillow's draft() makes; any other transform decodes the region at
// full scale first. So a RandomResizedCrop(224) of a 512 × 512 JPEG never
// decodes the pixels it throws away.
//
//   lockstep::ImageSample sample(bytes.data(), bytes.size(), lockstep::ColorMode::kRGB);
//   sample.crop(/*top=*/40, /*left=*/10, /*height=*/300, /*width=*/200);   // nothing decoded yet
//   sample.resize(224, 224, lockstep::Interpolation::kBilinear);          // decodes rows 40..340 only
//   sample.pixels().flip_horizontal();
//   lockstep::Image image = sample.take();
//
// The result equals torchvision's on a PIL image (decode, crop, then resize)
// whenever the decode is at full scale. With DCT scaling it equals Pillow's
// resize(size, box=region / s) of the draft-decoded image instead; pass
// dct_scaling = false for torchvision's pixels exactly, at the cost of full decodes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lockstep/data/image/image.h"
#include "lockstep/data/image/image_codec.h"
#include "lockstep/data/image/resample.h"

namespace lockstep {

class ImageSample {
 public:
  // `data` must outlive the sample. Reads the header (throws on a bad one).
  ImageSample(const uint8_t* data, size_t size, ColorMode mode, bool dct_scaling = true);
  // Already decoded pixels.
  explicit ImageSample(Image image);

  int height() const { return decoded_ ? image_.height() : region_.height; }
  int width() const { return decoded_ ? image_.width() : region_.width; }
  int channels() const;
  bool decoded() const { return decoded_; }
  // The scale of the last decode (1, 2, 4, 8): for tests and statistics.
  int decode_scale() const { return decode_scale_; }

  // PIL's crop: outside the image is black (and forces a decode).
  void crop(int top, int left, int height, int width);
  void resize(int height, int width, Interpolation interpolation);
  // The pixels, decoding what is pending at full scale.
  Image& pixels();
  Image take() { return std::move(pixels()); }

 private:
  // Decodes `region`, in the coordinates of the image at 1/scale.
  void decode(const PixelRegion& region, int scale);

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  ColorMode mode_ = ColorMode::kRGB;
  bool dct_scaling_ = true;
  ImageInfo info_;
  PixelRegion region_;  // still to decode, in full-scale pixels
  bool decoded_ = false;
  int decode_scale_ = 1;
  Image image_;
};

}  // namespace lockstep
