#include "lockstep/data/image/image_sample.h"

#include <algorithm>

namespace lockstep {

ImageSample::ImageSample(const uint8_t* data, size_t size, ColorMode mode, bool dct_scaling)
    : data_(data), size_(size), mode_(mode), dct_scaling_(dct_scaling), info_(read_image_info(data, size)) {
  region_ = {0, 0, info_.height, info_.width};
}

ImageSample::ImageSample(Image image) : decoded_(true), image_(std::move(image)) {
  mode_ = image_.channels() == 1 ? ColorMode::kGray : ColorMode::kRGB;
}

int ImageSample::channels() const { return channels_of(mode_); }

void ImageSample::decode(const PixelRegion& region, int scale) {
  image_ = decode_image(data_, size_, mode_, region, scale);
  decoded_ = true;
  decode_scale_ = scale;
}

Image& ImageSample::pixels() {
  if (!decoded_) decode(region_, 1);
  return image_;
}

void ImageSample::crop(int top, int left, int height, int width) {
  if (!decoded_ && top >= 0 && left >= 0 && height > 0 && width > 0 && top + height <= region_.height &&
      left + width <= region_.width) {
    region_ = {region_.top + top, region_.left + left, height, width};
    return;
  }
  image_ = pixels().crop(top, left, height, width);
}

void ImageSample::resize(int height, int width, Interpolation interpolation) {
  if (decoded_ || !dct_scaling_ || info_.format != ImageFormat::kJpeg) {
    image_ = resample(pixels(), height, width, interpolation);
    return;
  }
  // Pillow's draft(): the largest s in {8, 4, 2} with s <= min(W // w, H // h).
  const int room = std::min(region_.width / width, region_.height / height);
  int scale = 1;
  for (int s : {8, 4, 2}) {
    if (room >= s) {
      scale = s;
      break;
    }
  }
  if (scale == 1) {
    image_ = resample(pixels(), height, width, interpolation);
    return;
  }
  // The region in the coordinates of the 1/scale image, resampled from just
  // the pixels the filter reads there.
  const int full_height = scaled_size(info_.height, scale), full_width = scaled_size(info_.width, scale);
  const ResampleBox box = {static_cast<float>(region_.left) / scale, static_cast<float>(region_.top) / scale,
                           static_cast<float>(region_.left + region_.width) / scale,
                           static_cast<float>(region_.top + region_.height) / scale};
  const Footprint needed = resample_footprint(full_height, full_width, height, width, interpolation, box);
  decode({needed.y0, needed.x0, needed.y1 - needed.y0, needed.x1 - needed.x0}, scale);
  image_ = resample(image_, height, width, interpolation, box, {full_height, full_width, needed.y0, needed.x0});
}

}  // namespace lockstep
