// Decoding JPEG and PNG files as Pillow does (libjpeg-turbo and libpng underneath).
//
// A file's header is read first (read_image_info), so that transforms can
// choose their crop before any pixel is decoded. decode_image() then decodes
// only a region, optionally at 1/2, 1/4 or 1/8 scale (JPEG only: libjpeg-turbo
// scales during the inverse DCT, which costs a fraction of a full decode).
// The pixels equal Pillow's: Image.open(f).convert(mode) at scale 1, and
// Pillow's draft(mode, size) decode at scale 1/s, in the region.
//
//   std::string bytes = read_file("cat.jpg");
//   auto data = reinterpret_cast<const uint8_t*>(bytes.data());
//   lockstep::ImageInfo info = lockstep::read_image_info(data, bytes.size());   // 500 × 375, JPEG
//   lockstep::Image whole = lockstep::decode_image(data, bytes.size(), lockstep::ColorMode::kRGB);
//   // Rows 10..110 and columns 20..220 of the half-size image:
//   lockstep::Image part = lockstep::decode_image(data, bytes.size(), lockstep::ColorMode::kRGB,
//                                                 {/*top=*/10, /*left=*/20, /*height=*/100, /*width=*/200}, 2);
//
// A file that is not a JPEG or PNG, or is truncated or corrupt, throws
// lockstep::Error saying what is wrong (the caller adds the file's name).
// Colour conversions are Pillow's: grayscale to RGB repeats the value, RGB to
// gray is Pillow's luma, an alpha channel is dropped, palettes are expanded,
// Adobe CMYK JPEGs are inverted and converted as Pillow's CMYK → RGB.
// 16-bit PNG samples keep their high byte (Pillow clips 16-bit gray instead).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "lockstep/data/image/image.h"

namespace lockstep {

enum class ImageFormat { kJpeg, kPng };

struct ImageInfo {
  ImageFormat format = ImageFormat::kJpeg;
  int height = 0, width = 0;
};

// Rows [top, top + height) and columns [left, left + width).
struct PixelRegion {
  int top = 0, left = 0, height = 0, width = 0;
};

// Sniffs the format from the first bytes and reads the size from the header.
ImageInfo read_image_info(const uint8_t* data, size_t size);

// The size of the image decoded at 1/scale_denom: libjpeg-turbo's ceil(size / scale_denom).
inline int scaled_size(int size, int scale_denom) { return (size + scale_denom - 1) / scale_denom; }

// The whole image.
Image decode_image(const uint8_t* data, size_t size, ColorMode mode);
// `region` is in the coordinates of the image at 1/scale_denom (1, 2, 4 or 8;
// PNG only 1) and must lie inside it.
Image decode_image(const uint8_t* data, size_t size, ColorMode mode, const PixelRegion& region, int scale_denom = 1);

// "JPEG" or "PNG".
const char* format_name(ImageFormat format);

namespace detail {
// The codecs behind decode_image; `info` comes from read_image_info.
ImageInfo read_jpeg_info(const uint8_t* data, size_t size);
Image decode_jpeg(const uint8_t* data, size_t size, ColorMode mode, const PixelRegion& region, int scale_denom);
ImageInfo read_png_info(const uint8_t* data, size_t size);
Image decode_png(const uint8_t* data, size_t size, ColorMode mode, const PixelRegion& region);
}  // namespace detail

}  // namespace lockstep
