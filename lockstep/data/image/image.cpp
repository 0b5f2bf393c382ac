#include "lockstep/data/image/image.h"

#include <algorithm>
#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep {

Image::Image(int height, int width, int channels) : Image(height, width, channels, Uninitialized{}) {
  std::fill(pixels_.begin(), pixels_.end(), 0);
}

Image::Image(int height, int width, int channels, Uninitialized) : height_(height), width_(width), channels_(channels) {
  LOCKSTEP_CHECK(height >= 0 && width >= 0 && (channels == 1 || channels == 3), "Image: bad shape ", height, "x",
                 width, "x", channels, " (channels must be 1 or 3)");
  pixels_.resize(static_cast<size_t>(height) * width * channels);
}

Image Image::crop(int top, int left, int height, int width) const {
  Image out(std::max(height, 0), std::max(width, 0), channels_);
  // The part of the box inside the image; the rest stays 0.
  const int y0 = std::max(top, 0), y1 = std::min(top + height, height_);
  const int x0 = std::max(left, 0), x1 = std::min(left + width, width_);
  if (y0 >= y1 || x0 >= x1) return out;
  const size_t bytes = static_cast<size_t>(x1 - x0) * channels_;
  for (int y = y0; y < y1; ++y) std::memcpy(out.at(y - top, x0 - left), at(y, x0), bytes);
  return out;
}

void Image::flip_horizontal() {
  for (int y = 0; y < height_; ++y) {
    uint8_t* line = row(y);
    for (int a = 0, b = width_ - 1; a < b; ++a, --b) {
      std::swap_ranges(line + static_cast<size_t>(a) * channels_, line + static_cast<size_t>(a + 1) * channels_,
                       line + static_cast<size_t>(b) * channels_);
    }
  }
}

Image Image::to_channels(int channels) const {
  if (channels == channels_) return *this;
  Image out(height_, width_, channels, Uninitialized{});
  const size_t pixels = static_cast<size_t>(height_) * width_;
  const uint8_t* in = data();
  uint8_t* dst = out.data();
  if (channels == 1) {
    for (size_t i = 0; i < pixels; ++i) dst[i] = pil_luma(in + 3 * i);
  } else {
    for (size_t i = 0; i < pixels; ++i) dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = in[i];
  }
  return out;
}

PadMode parse_pad_mode(const std::string& name) {
  if (name == "constant") return PadMode::kConstant;
  if (name == "edge") return PadMode::kEdge;
  if (name == "reflect") return PadMode::kReflect;
  if (name == "symmetric") return PadMode::kSymmetric;
  LOCKSTEP_FAIL("unknown padding_mode '", name, "'; expected constant, edge, reflect or symmetric");
}

namespace {

// The source index numpy's np.pad reads for position `i` (possibly outside
// 0 .. size-1) of an axis of `size` pixels.
int padded_source(int i, int size, PadMode mode) {
  if (i >= 0 && i < size) return i;
  if (mode == PadMode::kEdge || size == 1) return i < 0 ? 0 : size - 1;
  // Mirroring repeats with period 2(size-1) (reflect) or 2 size (symmetric).
  const int period = mode == PadMode::kReflect ? 2 * (size - 1) : 2 * size;
  int k = i % period;
  if (k < 0) k += period;
  if (mode == PadMode::kReflect) return k < size ? k : period - k;
  return k < size ? k : period - 1 - k;
}

}  // namespace

Image pad_image(const Image& image, int left, int top, int right, int bottom, PadMode mode,
                const std::array<uint8_t, 3>& fill) {
  // Negative amounts crop first, as torchvision does.
  const Image* source = &image;
  Image cropped;
  if (left < 0 || top < 0 || right < 0 || bottom < 0) {
    const int cl = std::max(-left, 0), ct = std::max(-top, 0), cr = std::max(-right, 0), cb = std::max(-bottom, 0);
    cropped = image.crop(ct, cl, image.height() - ct - cb, image.width() - cl - cr);
    source = &cropped;
    left = std::max(left, 0), top = std::max(top, 0), right = std::max(right, 0), bottom = std::max(bottom, 0);
  }
  const int c = source->channels();
  Image out(source->height() + top + bottom, source->width() + left + right, c);
  LOCKSTEP_CHECK(mode == PadMode::kConstant || (source->height() > 0 && source->width() > 0),
                 "pad: cannot ", mode == PadMode::kEdge ? "extend" : "mirror", " an empty image");
  for (int y = 0; y < out.height(); ++y) {
    const int sy = y - top;
    uint8_t* target = out.row(y);
    for (int x = 0; x < out.width(); ++x) {
      const int sx = x - left;
      if (mode == PadMode::kConstant && (sy < 0 || sy >= source->height() || sx < 0 || sx >= source->width())) {
        for (int ch = 0; ch < c; ++ch) target[x * c + ch] = fill[ch];
        continue;
      }
      const uint8_t* pixel = source->at(padded_source(sy, source->height(), mode), padded_source(sx, source->width(), mode));
      std::memcpy(target + static_cast<size_t>(x) * c, pixel, c);
    }
  }
  return out;
}

void Image::write_chw(uint8_t* out) const {
  const size_t plane = static_cast<size_t>(height_) * width_;
  if (channels_ == 1) {
    std::memcpy(out, data(), plane);
    return;
  }
  const uint8_t* in = data();
  uint8_t* r = out;
  uint8_t* g = out + plane;
  uint8_t* b = out + 2 * plane;
  for (size_t i = 0; i < plane; ++i) {
    r[i] = in[3 * i];
    g[i] = in[3 * i + 1];
    b[i] = in[3 * i + 2];
  }
}

}  // namespace lockstep
