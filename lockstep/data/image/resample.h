// Resampling with Pillow's arithmetic, so that a resized image equals what
// torchvision computes on a PIL image, bit for bit.
//
// resample() is Pillow 9's Image.resize(size, filter, box) on 8-bit images:
// separable convolution, horizontal pass first (rounded to 8 bits), the
// filter widened by the scale when shrinking (antialiasing), coefficients in
// 22-bit fixed point; NEAREST is its affine nearest-neighbour path. The box
// is the region of the source to map onto the output, in float as Pillow
// keeps it.
//
//   lockstep::Image out = lockstep::resample(image, /*height=*/224, /*width=*/224,
//                                            lockstep::Interpolation::kBilinear);
//   // The region (10.5, 4) .. (300.5, 250) of the image, onto 224 × 224:
//   out = lockstep::resample(image, 224, 224, lockstep::Interpolation::kBilinear, {10.5f, 4, 300.5f, 250});
//
// The source may also be a window of a larger image that was never decoded
// whole (a JPEG region): SourceWindow says where `in` sits in that image, and
// the result is the one the whole image would give, provided the window holds
// every pixel the filter reads (resample_footprint() says which).
#pragma once

#include <array>
#include <string>

#include "lockstep/data/image/image.h"

namespace lockstep {

enum class Interpolation { kNearest, kBilinear, kBicubic };

// "nearest", "bilinear" or "bicubic" (torchvision's InterpolationMode values);
// anything else throws naming the three.
Interpolation parse_interpolation(const std::string& name);

// x0, y0, x1, y1 in source pixels (Pillow's box).
using ResampleBox = std::array<float, 4>;

// Where `in` sits inside the image being resampled (by default, it is that image).
struct SourceWindow {
  int full_height = -1, full_width = -1;  // -1: the size of `in`
  int top = 0, left = 0;
};

// The source rows [y0, y1) and columns [x0, x1) that resampling a
// full_height × full_width image's `box` to out_height × out_width reads.
struct Footprint {
  int y0, y1, x0, x1;
};
Footprint resample_footprint(int full_height, int full_width, int out_height, int out_width, Interpolation filter,
                             const ResampleBox& box);

Image resample(const Image& in, int out_height, int out_width, Interpolation filter);
Image resample(const Image& in, int out_height, int out_width, Interpolation filter, const ResampleBox& box,
               const SourceWindow& window = {});

}  // namespace lockstep
