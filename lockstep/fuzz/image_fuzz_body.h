// The body of the JPEG and PNG fuzz targets: header, whole decode in both
// colour modes, a region at reduced scale and a crop-and-resize through
// ImageSample. Bad files must end in lockstep::Error, never a crash, a hang
// or a huge allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lockstep/core/error.h"
#include "lockstep/data/image/image_codec.h"
#include "lockstep/data/image/image_sample.h"

namespace lockstep::fuzz {

inline void decode_image_every_way(const uint8_t* data, size_t size) {
  try {
    const ImageInfo info = read_image_info(data, size);
    // Bigger images take the same paths, only slower (a 1.5-megapixel CMYK
    // file takes 1 s under the sanitizers); the size limit itself is
    // read_image_info's.
    if (static_cast<int64_t>(info.height) * info.width > (int64_t{1} << 20)) return;
    (void)decode_image(data, size, ColorMode::kRGB);
    (void)decode_image(data, size, ColorMode::kGray);
    if (info.format == ImageFormat::kJpeg && info.height >= 4 && info.width >= 4) {
      const int height = scaled_size(info.height, 2), width = scaled_size(info.width, 2);
      (void)decode_image(data, size, ColorMode::kRGB, {height / 3, width / 3, height - height / 3, width - width / 3}, 2);
    }
    ImageSample sample(data, size, ColorMode::kRGB);
    sample.crop(info.height / 4, info.width / 4, info.height - info.height / 4, info.width - info.width / 4);
    sample.resize(3, 5, Interpolation::kBilinear);
  } catch (const Error&) {
  }
}

}  // namespace lockstep::fuzz
