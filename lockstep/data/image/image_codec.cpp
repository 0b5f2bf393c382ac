#include "lockstep/data/image/image_codec.h"

#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

bool is_jpeg(const uint8_t* data, size_t size) { return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF; }

bool is_png(const uint8_t* data, size_t size) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return size >= 8 && std::memcmp(data, kSignature, 8) == 0;
}

}  // namespace

const char* format_name(ImageFormat format) { return format == ImageFormat::kJpeg ? "JPEG" : "PNG"; }

ImageInfo read_image_info(const uint8_t* data, size_t size) {
  ImageInfo info;
  if (is_jpeg(data, size)) {
    info = detail::read_jpeg_info(data, size);
  } else if (is_png(data, size)) {
    info = detail::read_png_info(data, size);
  } else {
    LOCKSTEP_FAIL(size == 0 ? "the file is empty" : "not a JPEG or PNG file (it starts with neither signature)");
  }
  LOCKSTEP_CHECK(info.height > 0 && info.width > 0, format_name(info.format), ": the header gives an empty image (",
                 info.width, "x", info.height, ")");
  // Pillow's decompression-bomb limit: twice MAX_IMAGE_PIXELS.
  constexpr int64_t kMaxPixels = 2 * (int64_t{1024} * 1024 * 1024 / 4 / 3);
  LOCKSTEP_CHECK(static_cast<int64_t>(info.height) * info.width <= kMaxPixels, format_name(info.format), ": ",
                 info.width, "x", info.height, " pixels exceeds the limit of ", kMaxPixels,
                 " (Pillow's decompression-bomb limit)");
  return info;
}

Image decode_image(const uint8_t* data, size_t size, ColorMode mode) {
  const ImageInfo info = read_image_info(data, size);
  return decode_image(data, size, mode, {0, 0, info.height, info.width}, 1);
}

Image decode_image(const uint8_t* data, size_t size, ColorMode mode, const PixelRegion& region, int scale_denom) {
  LOCKSTEP_CHECK(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
                 "decode: scale 1/", scale_denom, " is not one of 1, 1/2, 1/4, 1/8");
  const ImageInfo info = read_image_info(data, size);
  const int height = scaled_size(info.height, scale_denom), width = scaled_size(info.width, scale_denom);
  LOCKSTEP_CHECK(region.top >= 0 && region.left >= 0 && region.height > 0 && region.width > 0 &&
                     region.top + region.height <= height && region.left + region.width <= width,
                 "decode: the region (top ", region.top, ", left ", region.left, ", ", region.height, "x",
                 region.width, ") is not inside the ", height, "x", width, " image");
  if (info.format == ImageFormat::kJpeg) return detail::decode_jpeg(data, size, mode, region, scale_denom);
  LOCKSTEP_CHECK(scale_denom == 1, "decode: a PNG decodes at full scale only");
  return detail::decode_png(data, size, mode, region);
}

}  // namespace lockstep
