// PNG encoding of image tensors: TensorBoard image summaries, sample grids
// of generative models, debugging dumps.
//
// Written by libpng (8-bit grayscale, RGB or RGBA, no interlacing, libpng's
// adaptive row filters); any PNG reader opens the result.
//
//   torch::Tensor image = generator->forward(noise);            // [N, 3, 32, 32] in [-1, 1]
//   torch::Tensor grid = lockstep::image_grid((image + 1) / 2, /*columns=*/8);
//   lockstep::write_png("work_dirs/gan/samples_0001000.png", grid);
//   std::string bytes = lockstep::encode_png(grid);              // the file's bytes
#pragma once

#include <cstdint>
#include <string>

#include <torch/types.h>

namespace lockstep {

// `image` is [C, H, W] with C in {1, 3, 4} (gray, RGB, RGBA) or [H, W]; uint8
// as is, or floating point in [0, 1] (clamped, scaled to 0..255 and rounded).
// On any device; `compression_level` is zlib's (0..9, -1 default).
std::string encode_png(const torch::Tensor& image, int compression_level = -1);
// Writes encode_png(image) to `path` atomically.
void write_png(const std::string& path, const torch::Tensor& image, int compression_level = -1);

// torchvision's make_grid: a batch [N, C, H, W] tiled into one [C, H', W']
// image, `columns` images per row, `padding` pixels of `pad_value` between
// and around them. Keeps the dtype.
torch::Tensor image_grid(const torch::Tensor& batch, int64_t columns = 8, int64_t padding = 2,
                         double pad_value = 0.0);

}  // namespace lockstep
