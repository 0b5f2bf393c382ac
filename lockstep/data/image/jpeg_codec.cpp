// JPEG through libjpeg-turbo's libjpeg API, with the settings Pillow uses
// (default DCT, fancy upsampling), so that the pixels are Pillow's.
#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include <jpeglib.h>
// jerror.h after jpeglib.h: the message codes (JWRN_JPEG_EOF).
#include <jerror.h>

#include "lockstep/core/error.h"
#include "lockstep/data/image/image_codec.h"

namespace lockstep::detail {
namespace {

// libjpeg reports errors through error_exit, which must not return: it
// jumps back to the setjmp of the decoding function, whose frame holds no
// object with a destructor between the setjmp and the libjpeg calls.
struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_jpeg_error(j_common_ptr cinfo) {
  auto* manager = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, manager->message);
  std::longjmp(manager->jump, 1);
}

// Warnings are Pillow's to ignore, except running out of data: libjpeg would
// fill the rest with gray where Pillow reports a truncated file.
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* manager = reinterpret_cast<JpegErrorManager*>(cinfo->err);
    std::snprintf(manager->message, sizeof manager->message, "the file is truncated (its data ends early)");
    std::longjmp(manager->jump, 1);
  }
}

void silent_output(j_common_ptr) {}

void init_error_manager(JpegErrorManager& manager) {
  jpeg_std_error(&manager.pub);
  manager.pub.error_exit = on_jpeg_error;
  manager.pub.emit_message = on_jpeg_message;
  manager.pub.output_message = silent_output;
  manager.message[0] = '\0';
}

// True when the scan data is followed by an end-of-image marker somewhere
// after `scan_start`: a truncated file has none (the EOI of an EXIF thumbnail
// lies before the first scan).
bool has_end_marker(const uint8_t* data, size_t size, size_t scan_start) {
  for (size_t i = size; i >= scan_start + 2; --i) {
    if (data[i - 2] == 0xFF && data[i - 1] == 0xD9) return true;
  }
  return false;
}

// Pillow's CMYK;I unpacking (Adobe's inverted CMYK) and cmyk2rgb.
inline uint8_t cmyk_channel(uint8_t stored_ink, int not_black) {
  const int ink = 255 - stored_ink;
  int tmp = ink * not_black + 128;
  tmp = ((tmp >> 8) + tmp) >> 8;
  const int value = not_black - tmp;
  return static_cast<uint8_t>(value <= 0 ? 0 : value < 256 ? value : 255);
}

// One decoded scanline (`components` per pixel) into a row of `mode`.
void convert_row(const uint8_t* in, int components, int width, ColorMode mode, uint8_t* out) {
  if (components == 3 && mode == ColorMode::kRGB) {
    std::memcpy(out, in, static_cast<size_t>(width) * 3);
    return;
  }
  if (components == 1) {
    if (mode == ColorMode::kGray) {
      std::memcpy(out, in, width);
    } else {
      for (int x = 0; x < width; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[x];
    }
    return;
  }
  uint8_t rgb[3];
  for (int x = 0; x < width; ++x) {
    const uint8_t* pixel = in + static_cast<size_t>(x) * components;
    if (components == 4) {
      const int not_black = pixel[3];  // 255 - K after inverting the stored K
      rgb[0] = cmyk_channel(pixel[0], not_black);
      rgb[1] = cmyk_channel(pixel[1], not_black);
      rgb[2] = cmyk_channel(pixel[2], not_black);
      pixel = rgb;
    }
    if (mode == ColorMode::kGray) {
      out[x] = pil_luma(pixel);
    } else {
      out[3 * x] = pixel[0];
      out[3 * x + 1] = pixel[1];
      out[3 * x + 2] = pixel[2];
    }
  }
}

// The decoding itself; false (with manager.message) on a libjpeg error.
// `image` and `scanline` are owned by the caller so that a longjmp out of
// libjpeg skips no destructor.
bool run_jpeg(jpeg_decompress_struct& cinfo, JpegErrorManager& manager, const uint8_t* data, size_t size,
              ColorMode mode, const PixelRegion* region, int scale_denom, ImageInfo* info, Image* image,
              std::vector<uint8_t>* scanline) {
  cinfo.err = &manager.pub;
  if (setjmp(manager.jump)) return false;
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  info->format = ImageFormat::kJpeg;
  info->height = static_cast<int>(cinfo.image_height);
  info->width = static_cast<int>(cinfo.image_width);
  if (region == nullptr) return true;

  const int components = cinfo.num_components;
  if (components != 1 && components != 3 && components != 4) {
    std::snprintf(manager.message, sizeof manager.message, "a JPEG with %d components (expected 1, 3 or 4)",
                  components);
    return false;
  }
  const size_t scan_start = size - cinfo.src->bytes_in_buffer;
  if (!has_end_marker(data, size, scan_start)) {
    std::snprintf(manager.message, sizeof manager.message,
                  "the file is truncated (no end-of-image marker after the image data)");
    return false;
  }
  cinfo.out_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(scale_denom);
  jpeg_start_decompress(&cinfo);

  // Columns: libjpeg-turbo moves the crop's left edge back to an iMCU
  // boundary; `skip` is how far the wanted columns start inside what it
  // decodes. Its right edge is treated as the image's edge by the chroma
  // upsampling, so one iMCU more is decoded there than is kept: the last
  // kept column then sees its true neighbours, as in a whole decode.
  const int imcu_width = cinfo.max_h_samp_factor * cinfo.min_DCT_scaled_size;
  JDIMENSION crop_left = static_cast<JDIMENSION>(region->left);
  JDIMENSION crop_width = static_cast<JDIMENSION>(
      std::min<int>(region->width + imcu_width, static_cast<int>(cinfo.output_width) - region->left));
  if (crop_width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &crop_left, &crop_width);
  const int skip = region->left - static_cast<int>(crop_left);
  scanline->resize(static_cast<size_t>(cinfo.output_width) * cinfo.output_components);
  if (region->top > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(region->top));
  for (int y = 0; y < region->height; ++y) {
    JSAMPROW row = scanline->data();
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
      std::snprintf(manager.message, sizeof manager.message, "the decoder stopped at row %d", region->top + y);
      return false;
    }
    convert_row(scanline->data() + static_cast<size_t>(skip) * components, components, region->width, mode,
                image->row(y));
  }
  return true;
}

}  // namespace

ImageInfo read_jpeg_info(const uint8_t* data, size_t size) {
  jpeg_decompress_struct cinfo;
  JpegErrorManager manager;
  init_error_manager(manager);
  ImageInfo info;
  const bool ok = run_jpeg(cinfo, manager, data, size, ColorMode::kRGB, nullptr, 1, &info, nullptr, nullptr);
  jpeg_destroy_decompress(&cinfo);
  LOCKSTEP_CHECK(ok, "bad JPEG: ", manager.message);
  return info;
}

Image decode_jpeg(const uint8_t* data, size_t size, ColorMode mode, const PixelRegion& region, int scale_denom) {
  jpeg_decompress_struct cinfo;
  JpegErrorManager manager;
  init_error_manager(manager);
  ImageInfo info;
  Image image(region.height, region.width, channels_of(mode), Image::Uninitialized{});
  std::vector<uint8_t> scanline;
  const bool ok = run_jpeg(cinfo, manager, data, size, mode, &region, scale_denom, &info, &image, &scanline);
  jpeg_destroy_decompress(&cinfo);
  LOCKSTEP_CHECK(ok, "bad JPEG: ", manager.message);
  return image;
}

}  // namespace lockstep::detail
