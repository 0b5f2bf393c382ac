#include "lockstep/core/png.h"

#include <zlib.h>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

void put_u32(std::string& out, uint32_t value) {
  out.push_back(static_cast<char>(value >> 24));
  out.push_back(static_cast<char>(value >> 16));
  out.push_back(static_cast<char>(value >> 8));
  out.push_back(static_cast<char>(value));
}

// A chunk: length, type, data, and the CRC-32 of type and data.
void put_chunk(std::string& out, const char type[4], const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out.size();
  out.append(type, 4);
  out += data;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  crc = ::crc32(crc, reinterpret_cast<const Bytef*>(out.data() + type_at), static_cast<uInt>(4 + data.size()));
  put_u32(out, static_cast<uint32_t>(crc));
}

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

}  // namespace

std::string encode_png(const torch::Tensor& image, int compression_level) {
  LOCKSTEP_CHECK(compression_level >= -1 && compression_level <= 9, "encode_png: compression level must be -1..9, got ",
                 compression_level);
  const torch::Tensor pixels = to_hwc_bytes(image);
  const auto height = static_cast<uint32_t>(pixels.size(0));
  const auto width = static_cast<uint32_t>(pixels.size(1));
  const auto channels = static_cast<size_t>(pixels.size(2));
  const size_t row_bytes = width * channels;

  // Every scanline starts with its filter type; 0 (none) keeps the writer trivial.
  std::string raw;
  raw.reserve(height * (row_bytes + 1));
  const auto* data = pixels.data_ptr<uint8_t>();
  for (uint32_t y = 0; y < height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(data + y * row_bytes), row_bytes);
  }
  uLongf compressed_size = ::compressBound(static_cast<uLong>(raw.size()));
  std::string compressed(compressed_size, '\0');
  const int status = ::compress2(reinterpret_cast<Bytef*>(compressed.data()), &compressed_size,
                                 reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()),
                                 compression_level);
  LOCKSTEP_CHECK(status == Z_OK, "encode_png: zlib compression failed (code ", status, ")");
  compressed.resize(compressed_size);

  std::string header;
  put_u32(header, width);
  put_u32(header, height);
  header.push_back(8);  // bits per sample
  const char color_type = channels == 1 ? 0 : (channels == 3 ? 2 : 6);
  header.push_back(color_type);
  header.append(3, '\0');  // deflate compression, adaptive filtering, no interlace

  std::string png("\x89PNG\r\n\x1a\n", 8);
  put_chunk(png, "IHDR", header);
  put_chunk(png, "IDAT", compressed);
  put_chunk(png, "IEND", "");
  return png;
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
