#include "lockstep/core/png.h"

#include <csetjmp>
#include <cstdio>
#include <new>

#include <png.h>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// Where libpng writes the file's bytes, and the message of an error it
// raises (its errors longjmp out; see write_rows).
struct PngSink {
  std::string bytes;
  char message[256] = {0};
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* sink = static_cast<PngSink*>(png_get_error_ptr(png));
  std::snprintf(sink->message, sizeof sink->message, "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

void append_bytes(png_structp png, png_bytep data, png_size_t length) {
  auto* sink = static_cast<PngSink*>(png_get_io_ptr(png));
  try {
    sink->bytes.append(reinterpret_cast<const char*>(data), length);
  } catch (const std::bad_alloc&) {
    png_error(png, "out of memory");  // no exception may cross libpng's C frames
  }
}

void flush_nothing(png_structp) {}

// [H, W, C] uint8, contiguous, on the CPU.
torch::Tensor to_hwc_bytes(const torch::Tensor& image) {
  LOCKSTEP_CHECK(image.defined(), "encode_png: the image tensor is undefined");
  torch::Tensor chw = image.dim() == 2 ? image.unsqueeze(0) : image;
  LOCKSTEP_CHECK(chw.dim() == 3, "encode_png: expected an image [C, H, W] or [H, W], got shape ", image.sizes());
  const int64_t channels = chw.size(0);
  LOCKSTEP_CHECK(channels == 1 || channels == 3 || channels == 4,
                 "encode_png: expected 1, 3 or 4 channels (gray, RGB, RGBA) in dimension 0, got shape ", image.sizes());
  LOCKSTEP_CHECK(chw.size(1) > 0 && chw.size(2) > 0, "encode_png: the image is empty (shape ", image.sizes(), ")");
  LOCKSTEP_CHECK(chw.size(1) < (1ll << 31) && chw.size(2) < (1ll << 31), "encode_png: image too large for PNG");
  chw = chw.detach().to(torch::kCPU);
  if (chw.scalar_type() != torch::kUInt8) {
    LOCKSTEP_CHECK(chw.is_floating_point(), "encode_png: expected uint8 or floating point pixels, got ",
                   c10::toString(chw.scalar_type()));
    chw = chw.to(torch::kFloat).clamp(0.0, 1.0).mul(255.0).round().to(torch::kUInt8);
  }
  return chw.permute({1, 2, 0}).contiguous();
}

// The encoding itself: 8 bits per sample, no interlacing, libpng's adaptive
// row filters; false (with sink.message) on a libpng error. Everything with a
// destructor is owned by the caller, so that libpng's longjmp skips none.
bool write_rows(png_structp png, png_infop info, PngSink& sink, const uint8_t* pixels, uint32_t height,
                uint32_t width, size_t channels, int compression_level) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_write_fn(png, &sink, append_bytes, flush_nothing);
  png_set_compression_level(png, compression_level);
  const int color_type = channels == 1 ? PNG_COLOR_TYPE_GRAY
                         : channels == 3 ? PNG_COLOR_TYPE_RGB
                                         : PNG_COLOR_TYPE_RGB_ALPHA;
  png_set_IHDR(png, info, width, height, 8, color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const size_t row_bytes = width * channels;
  for (uint32_t y = 0; y < height; ++y) png_write_row(png, pixels + y * row_bytes);
  png_write_end(png, nullptr);
  return true;
}

}  // namespace

std::string encode_png(const torch::Tensor& image, int compression_level) {
  LOCKSTEP_CHECK(compression_level >= -1 && compression_level <= 9, "encode_png: compression level must be -1..9, got ",
                 compression_level);
  const torch::Tensor pixels = to_hwc_bytes(image);
  PngSink sink;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &sink, on_png_error, on_png_warning);
  LOCKSTEP_CHECK(png != nullptr, "encode_png: libpng could not start (out of memory)");
  png_infop info = png_create_info_struct(png);
  const bool have_info = info != nullptr;
  const bool written = have_info && write_rows(png, info, sink, pixels.data_ptr<uint8_t>(),
                                               static_cast<uint32_t>(pixels.size(0)),
                                               static_cast<uint32_t>(pixels.size(1)),
                                               static_cast<size_t>(pixels.size(2)), compression_level);
  png_destroy_write_struct(&png, have_info ? &info : nullptr);
  LOCKSTEP_CHECK(written, "encode_png: libpng failed: ", have_info ? sink.message : "out of memory");
  return std::move(sink.bytes);
}

void write_png(const std::string& path, const torch::Tensor& image, int compression_level) {
  write_file_atomically(path, encode_png(image, compression_level));
}

torch::Tensor image_grid(const torch::Tensor& batch, int64_t columns, int64_t padding, double pad_value) {
  LOCKSTEP_CHECK(batch.defined() && batch.dim() == 4, "image_grid: expected a batch [N, C, H, W], got ",
                 batch.defined() ? batch.sizes() : c10::IntArrayRef{});
  LOCKSTEP_CHECK(columns >= 1, "image_grid: columns must be at least 1, got ", columns);
  LOCKSTEP_CHECK(padding >= 0, "image_grid: padding must be >= 0, got ", padding);
  const int64_t count = batch.size(0);
  const int64_t channels = batch.size(1);
  const int64_t height = batch.size(2);
  const int64_t width = batch.size(3);
  const int64_t cols = std::max<int64_t>(1, std::min(columns, count));
  const int64_t rows = (count + cols - 1) / cols;
  torch::Tensor grid = torch::full({channels, rows * (height + padding) + padding, cols * (width + padding) + padding},
                                   pad_value, batch.options());
  for (int64_t i = 0; i < count; ++i) {
    const int64_t top = (i / cols) * (height + padding) + padding;
    const int64_t left = (i % cols) * (width + padding) + padding;
    grid.narrow(1, top, height).narrow(2, left, width).copy_(batch[i]);
  }
  return grid;
}

}  // namespace lockstep
