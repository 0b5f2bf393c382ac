#include "lockstep/data/image/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// Pillow's Resample.c, term by term: the filters, precompute_coeffs,
// normalize_coeffs_8bpc and the two 8-bit passes.
constexpr int kPrecisionBits = 32 - 8 - 2;

double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Filter {
  double (*weight)(double);
  double support;
};

Filter filter_of(Interpolation interpolation) {
  return interpolation == Interpolation::kBicubic ? Filter{bicubic_filter, 2.0} : Filter{bilinear_filter, 1.0};
}

// One axis: for each output pixel, the first source pixel and how many it
// reads (bounds), and their fixed-point weights (ksize per output pixel).
struct AxisCoefficients {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

AxisCoefficients precompute_coefficients(int in_size, float in0, float in1, int out_size, const Filter& filter) {
  AxisCoefficients axis;
  const double scale = static_cast<double>(in1 - in0) / out_size;  // the difference in float, as Pillow
  const double filterscale = std::max(scale, 1.0);
  const double support = filter.support * filterscale;
  axis.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  axis.first.resize(out_size);
  axis.count.resize(out_size);
  axis.weights.assign(static_cast<size_t>(out_size) * axis.ksize, 0);
  std::vector<double> k(axis.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = filter.weight((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    int32_t* out = &axis.weights[static_cast<size_t>(xx) * axis.ksize];
    for (int x = 0; x < xmax; ++x) {
      const double value = ww != 0.0 ? k[x] / ww : k[x];
      out[x] = value < 0 ? static_cast<int32_t>(-0.5 + value * (1 << kPrecisionBits))
                         : static_cast<int32_t>(0.5 + value * (1 << kPrecisionBits));
    }
    axis.first[xx] = xmin;
    axis.count[xx] = xmax;
  }
  return axis;
}

inline uint8_t clip8(int value) {
  const int shifted = value >> kPrecisionBits;
  return static_cast<uint8_t>(shifted < 0 ? 0 : shifted > 255 ? 255 : shifted);
}

// Nearest neighbour: Pillow's ImagingScaleAffine tables (the position
// advances by repeated addition, as there). -1 marks a pixel outside.
std::vector<int> nearest_positions(int in_size, float in0, float in1, int out_size) {
  const double step = static_cast<double>(in1 - in0) / out_size;
  double position = in0 + step * 0.5;
  std::vector<int> table(out_size);
  for (int x = 0; x < out_size; ++x) {
    const int source = position < 0.0 ? -1 : static_cast<int>(position);
    table[x] = source < in_size ? source : -1;
    position += step;
  }
  return table;
}

void check_window(const Image& in, const SourceWindow& window, const Footprint& needed) {
  LOCKSTEP_CHECK(needed.y0 >= window.top && needed.y1 <= window.top + in.height() && needed.x0 >= window.left &&
                     needed.x1 <= window.left + in.width(),
                 "resample: the decoded window (rows ", window.top, "..", window.top + in.height(), ", columns ",
                 window.left, "..", window.left + in.width(), ") misses pixels the filter reads (rows ", needed.y0,
                 "..", needed.y1, ", columns ", needed.x0, "..", needed.x1, ")");
}

Image resample_nearest(const Image& in, int out_height, int out_width, const ResampleBox& box,
                       const SourceWindow& window, int full_height, int full_width) {
  const std::vector<int> xs = nearest_positions(full_width, box[0], box[2], out_width);
  const std::vector<int> ys = nearest_positions(full_height, box[1], box[3], out_height);
  const int c = in.channels();
  Image out(out_height, out_width, c);  // outside the source: 0, as Pillow's fill
  for (int y = 0; y < out_height; ++y) {
    if (ys[y] < 0) continue;
    const uint8_t* source = in.row(ys[y] - window.top);
    uint8_t* target = out.row(y);
    for (int x = 0; x < out_width; ++x) {
      if (xs[x] < 0) continue;
      std::memcpy(target + static_cast<size_t>(x) * c, source + static_cast<size_t>(xs[x] - window.left) * c, c);
    }
  }
  return out;
}

// The horizontal pass: rows [ybox_first, ybox_last) of the full image (`in`
// holds `window` of it), each resampled to the output's width.
Image horizontal_pass(const Image& in, const AxisCoefficients& horizontal, int ybox_first, int ybox_last,
                      const SourceWindow& window) {
  const int c = in.channels();
  const int out_width = static_cast<int>(horizontal.first.size());
  Image temp(ybox_last - ybox_first, out_width, c, Image::Uninitialized{});
  for (int yy = 0; yy < temp.height(); ++yy) {
    const uint8_t* source = in.row(yy + ybox_first - window.top);
    uint8_t* target = temp.row(yy);
    for (int xx = 0; xx < out_width; ++xx) {
      const int32_t* k = &horizontal.weights[static_cast<size_t>(xx) * horizontal.ksize];
      const uint8_t* pixels = source + static_cast<size_t>(horizontal.first[xx] - window.left) * c;
      const int taps = horizontal.count[xx];
      if (c == 3) {
        int r = 1 << (kPrecisionBits - 1), g = r, b = r;
        for (int x = 0; x < taps; ++x) {
          r += pixels[3 * x] * k[x];
          g += pixels[3 * x + 1] * k[x];
          b += pixels[3 * x + 2] * k[x];
        }
        target[3 * xx] = clip8(r);
        target[3 * xx + 1] = clip8(g);
        target[3 * xx + 2] = clip8(b);
      } else {
        int sum = 1 << (kPrecisionBits - 1);
        for (int x = 0; x < taps; ++x) sum += pixels[x] * k[x];
        target[xx] = clip8(sum);
      }
    }
  }
  return temp;
}

// The vertical pass: each output row from the rows of `rows` (full-image
// rows from `rows_top` on, columns from `rows_left` on) its filter reads.
Image vertical_pass(const Image& rows, int rows_top, int rows_left, const AxisCoefficients& vertical) {
  const int c = rows.channels();
  const int out_height = static_cast<int>(vertical.first.size());
  Image out(out_height, rows.width(), c, Image::Uninitialized{});
  const int width_bytes = rows.width() * c;
  std::vector<int> sums(width_bytes);
  for (int yy = 0; yy < out_height; ++yy) {
    const int32_t* k = &vertical.weights[static_cast<size_t>(yy) * vertical.ksize];
    const int first = vertical.first[yy] - rows_top;
    std::fill(sums.begin(), sums.end(), 1 << (kPrecisionBits - 1));
    for (int y = 0; y < vertical.count[yy]; ++y) {
      const uint8_t* source = rows.row(first + y) + rows_left * c;
      const int weight = k[y];
      for (int i = 0; i < width_bytes; ++i) sums[i] += source[i] * weight;
    }
    uint8_t* target = out.row(yy);
    for (int i = 0; i < width_bytes; ++i) target[i] = clip8(sums[i]);
  }
  return out;
}

}  // namespace

Interpolation parse_interpolation(const std::string& name) {
  if (name == "bilinear") return Interpolation::kBilinear;
  if (name == "bicubic") return Interpolation::kBicubic;
  if (name == "nearest") return Interpolation::kNearest;
  LOCKSTEP_FAIL("unknown interpolation '", name, "'; expected bilinear, bicubic or nearest");
}

Footprint resample_footprint(int full_height, int full_width, int out_height, int out_width, Interpolation filter,
                             const ResampleBox& box) {
  auto span = [&](int in_size, float in0, float in1, int out_size, int* lo, int* hi) {
    *lo = in_size;
    *hi = 0;
    if (filter == Interpolation::kNearest) {
      for (int source : nearest_positions(in_size, in0, in1, out_size)) {
        if (source < 0) continue;
        *lo = std::min(*lo, source);
        *hi = std::max(*hi, source + 1);
      }
    } else {
      const AxisCoefficients axis = precompute_coefficients(in_size, in0, in1, out_size, filter_of(filter));
      for (int i = 0; i < out_size; ++i) {
        if (axis.count[i] <= 0) continue;
        *lo = std::min(*lo, axis.first[i]);
        *hi = std::max(*hi, axis.first[i] + axis.count[i]);
      }
    }
    if (*lo >= *hi) *lo = *hi = 0;
  };
  Footprint footprint{};
  span(full_height, box[1], box[3], out_height, &footprint.y0, &footprint.y1);
  span(full_width, box[0], box[2], out_width, &footprint.x0, &footprint.x1);
  return footprint;
}

Image resample(const Image& in, int out_height, int out_width, Interpolation filter) {
  return resample(in, out_height, out_width, filter,
                  {0.f, 0.f, static_cast<float>(in.width()), static_cast<float>(in.height())});
}

Image resample(const Image& in, int out_height, int out_width, Interpolation filter, const ResampleBox& box,
               const SourceWindow& window) {
  LOCKSTEP_CHECK(out_height > 0 && out_width > 0, "resample: the output size must be positive, got ", out_height,
                 "x", out_width);
  const int full_height = window.full_height < 0 ? in.height() : window.full_height;
  const int full_width = window.full_width < 0 ? in.width() : window.full_width;
  LOCKSTEP_CHECK(box[0] >= 0 && box[1] >= 0 && box[2] <= full_width && box[3] <= full_height && box[0] < box[2] &&
                     box[1] < box[3],
                 "resample: the box (", box[0], ", ", box[1], ", ", box[2], ", ", box[3],
                 ") is not a region inside the ", full_width, "x", full_height, " image");
  check_window(in, window, resample_footprint(full_height, full_width, out_height, out_width, filter, box));
  // Image.resize returns a copy when nothing changes.
  if (out_height == full_height && out_width == full_width && box[0] == 0 && box[1] == 0 && box[2] == full_width &&
      box[3] == full_height && window.top == 0 && window.left == 0) {
    return in;
  }
  if (filter == Interpolation::kNearest) {
    return resample_nearest(in, out_height, out_width, box, window, full_height, full_width);
  }
  const Filter f = filter_of(filter);
  const bool need_horizontal = out_width != full_width || box[0] != 0 || box[2] != out_width;
  const bool need_vertical = out_height != full_height || box[1] != 0 || box[3] != out_height;
  const AxisCoefficients horizontal = precompute_coefficients(full_width, box[0], box[2], out_width, f);
  const AxisCoefficients vertical = precompute_coefficients(full_height, box[1], box[3], out_height, f);
  const int ybox_first = vertical.first[0];
  const int ybox_last = vertical.first[out_height - 1] + vertical.count[out_height - 1];

  // The horizontal pass covers only the rows the vertical pass reads;
  // `rows` then holds full-image rows from `rows_top` on.
  Image temp;
  const Image* rows = &in;
  int rows_top = window.top, rows_left = window.left;
  if (need_horizontal) {
    temp = horizontal_pass(in, horizontal, ybox_first, ybox_last, window);
    rows = &temp;
    rows_top = ybox_first;
    rows_left = 0;
  }
  if (!need_vertical) {
    // Only reached with need_horizontal (else the copy above): temp is the result.
    return temp;
  }
  return vertical_pass(*rows, rows_top, rows_left, vertical);
}

}  // namespace lockstep
