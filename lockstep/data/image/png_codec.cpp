// PNG through libpng, reduced to 8-bit gray or RGB the way Pillow's
// convert("L") / convert("RGB") reduce it.
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include <png.h>

#include "lockstep/core/error.h"
#include "lockstep/data/image/image_codec.h"

namespace lockstep::detail {
namespace {

struct PngReader {
  const uint8_t* data;
  size_t size;
  size_t offset;
  char message[256];
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* reader = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(reader->message, sizeof reader->message, "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}  // Pillow reads on too

void read_bytes(png_structp png, png_bytep out, png_size_t length) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (reader->size - reader->offset < length) png_error(png, "the file is truncated (its data ends early)");
  std::memcpy(out, reader->data + reader->offset, length);
  reader->offset += length;
}

// The decoding itself; false (with reader.message) on a libpng error.
// Everything with a destructor is owned by the caller, so that libpng's
// longjmp skips none.
bool run_png(png_structp png, png_infop info, PngReader& reader, ColorMode mode, const PixelRegion* region,
             ImageInfo* header, Image* image, std::vector<uint8_t>* pixels) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, &reader, read_bytes);
  png_read_info(png, info);
  header->format = ImageFormat::kPng;
  header->width = static_cast<int>(png_get_image_width(png, info));
  header->height = static_cast<int>(png_get_image_height(png, info));
  if (region == nullptr) return true;

  // A truncated file lacks its closing IEND chunk; Pillow refuses it, and so
  // does lockstep even when the rows asked for come before the cut.
  bool has_end = false;
  for (size_t i = reader.size; i >= reader.offset + 4 && !has_end; --i) {
    has_end = std::memcmp(reader.data + i - 4, "IEND", 4) == 0;
  }
  if (!has_end) {
    std::snprintf(reader.message, sizeof reader.message, "the file is truncated (no IEND chunk after the image data)");
    return false;
  }
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16) png_set_strip_16(png);
  if (color_type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int components = png_get_channels(png, info);
  if (components != 1 && components != 3) {
    std::snprintf(reader.message, sizeof reader.message, "unexpected %d channels after expansion", components);
    return false;
  }
  const size_t row_bytes = png_get_rowbytes(png, info);
  // An interlaced image needs every row for every pass; otherwise rows are
  // read one at a time and reading stops after the region's last.
  const int rows = passes > 1 ? header->height : region->top + region->height;
  pixels->resize(row_bytes * (passes > 1 ? rows : 1));
  for (int pass = 0; pass < passes; ++pass) {
    for (int y = 0; y < rows; ++y) {
      png_bytep row = pixels->data() + (passes > 1 ? row_bytes * y : 0);
      png_read_row(png, row, nullptr);
      if (passes > 1 || y < region->top) continue;
      const uint8_t* in = row + static_cast<size_t>(region->left) * components;
      uint8_t* out = image->row(y - region->top);
      if (components == 1 && mode == ColorMode::kGray) {
        std::memcpy(out, in, region->width);
      } else if (components == 3 && mode == ColorMode::kRGB) {
        std::memcpy(out, in, static_cast<size_t>(region->width) * 3);
      } else if (components == 1) {
        for (int x = 0; x < region->width; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[x];
      } else {
        for (int x = 0; x < region->width; ++x) out[x] = pil_luma(in + 3 * x);
      }
    }
  }
  if (passes > 1) {
    Image whole(header->height, header->width, components);
    std::memcpy(whole.data(), pixels->data(), pixels->size());
    *image = whole.crop(region->top, region->left, region->height, region->width).to_channels(channels_of(mode));
  }
  return true;
}

template <typename Result>
Result with_png(const uint8_t* data, size_t size, ColorMode mode, const PixelRegion* region) {
  PngReader reader{data, size, 0, {0}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, on_png_error, on_png_warning);
  LOCKSTEP_CHECK(png != nullptr, "PNG: libpng could not start");
  png_infop info = png_create_info_struct(png);
  ImageInfo header;
  Image image(region ? region->height : 0, region ? region->width : 0, channels_of(mode));
  std::vector<uint8_t> pixels;
  const bool ok = info != nullptr && run_png(png, info, reader, mode, region, &header, &image, &pixels);
  png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  LOCKSTEP_CHECK(ok, "bad PNG: ", reader.message[0] ? reader.message : "libpng could not start");
  if constexpr (std::is_same_v<Result, ImageInfo>) {
    return header;
  } else {
    return image;
  }
}

}  // namespace

ImageInfo read_png_info(const uint8_t* data, size_t size) {
  return with_png<ImageInfo>(data, size, ColorMode::kRGB, nullptr);
}

Image decode_png(const uint8_t* data, size_t size, ColorMode mode, const PixelRegion& region) {
  return with_png<Image>(data, size, mode, &region);
}

}  // namespace lockstep::detail
