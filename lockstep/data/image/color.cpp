#include "lockstep/data/image/color.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// Pillow's ImagingBlend(degenerate, image, alpha), alpha a C float, on one byte.
inline uint8_t blend(int degenerate, int value, float alpha) {
  if (alpha >= 0 && alpha <= 1.0) return static_cast<uint8_t>(degenerate + alpha * (value - degenerate));
  const float mixed = static_cast<float>(degenerate + alpha * (value - degenerate));
  if (mixed <= 0.0) return 0;
  if (mixed >= 255.0) return 255;
  return static_cast<uint8_t>(mixed);
}

size_t byte_count(const Image& image) {
  return static_cast<size_t>(image.height()) * image.width() * image.channels();
}

// Pillow's rgb2hsv_row and hsv2rgb, with their float and double steps.
void rgb_to_hsv(const uint8_t* in, uint8_t* out) {
  const uint8_t r = in[0], g = in[1], b = in[2];
  const uint8_t maxc = std::max(r, std::max(g, b)), minc = std::min(r, std::min(g, b));
  out[2] = maxc;
  if (minc == maxc) {
    out[0] = out[1] = 0;
    return;
  }
  const float cr = static_cast<float>(maxc - minc);
  const float s = cr / static_cast<float>(maxc);
  const float rc = static_cast<float>(maxc - r) / cr;
  const float gc = static_cast<float>(maxc - g) / cr;
  const float bc = static_cast<float>(maxc - b) / cr;
  float h;
  if (r == maxc) {
    h = bc - gc;
  } else if (g == maxc) {
    h = static_cast<float>(2.0 + rc - bc);
  } else {
    h = static_cast<float>(4.0 + gc - rc);
  }
  h = static_cast<float>(std::fmod(h / 6.0 + 1.0, 1.0));
  auto clip = [](int v) { return static_cast<uint8_t>(v <= 0 ? 0 : v < 256 ? v : 255); };
  out[0] = clip(static_cast<int>(h * 255.0));
  out[1] = clip(static_cast<int>(s * 255.0));
}

void hsv_to_rgb(const uint8_t* in, uint8_t* out) {
  const uint8_t h = in[0], s = in[1], v = in[2];
  if (s == 0) {
    out[0] = out[1] = out[2] = v;
    return;
  }
  const int i = static_cast<int>(std::floor(static_cast<float>(h) * 6.0 / 255.0));
  const float f = static_cast<float>(static_cast<float>(h) * 6.0 / 255.0 - static_cast<float>(i));
  const float fs = static_cast<float>(static_cast<float>(s) / 255.0);
  auto clip = [](double value) {
    const int v = static_cast<int>(std::round(value));
    return static_cast<uint8_t>(v <= 0 ? 0 : v < 256 ? v : 255);
  };
  const uint8_t p = clip(static_cast<float>(v) * (1.0 - fs));
  const uint8_t q = clip(static_cast<float>(v) * (1.0 - fs * f));
  const uint8_t t = clip(static_cast<float>(v) * (1.0 - fs * (1.0 - f)));
  switch (i % 6) {
    case 0: out[0] = v, out[1] = t, out[2] = p; break;
    case 1: out[0] = q, out[1] = v, out[2] = p; break;
    case 2: out[0] = p, out[1] = v, out[2] = t; break;
    case 3: out[0] = p, out[1] = q, out[2] = v; break;
    case 4: out[0] = t, out[1] = p, out[2] = v; break;
    default: out[0] = v, out[1] = p, out[2] = q; break;
  }
}

}  // namespace

void adjust_brightness(Image& image, double factor) {
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f) return;
  uint8_t* pixels = image.data();
  for (size_t i = 0, n = byte_count(image); i < n; ++i) pixels[i] = alpha == 0.0f ? 0 : blend(0, pixels[i], alpha);
}

void adjust_contrast(Image& image, double factor) {
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f) return;
  // ImageStat's mean of the L image, in double, rounded as Pillow's int(mean + 0.5).
  const Image gray = image.to_channels(1);
  std::vector<int64_t> histogram(256, 0);
  const size_t pixels_count = static_cast<size_t>(gray.height()) * gray.width();
  for (size_t i = 0; i < pixels_count; ++i) ++histogram[gray.data()[i]];
  double sum = 0.0;
  for (int level = 0; level < 256; ++level) sum += static_cast<double>(level) * histogram[level];
  const int mean = pixels_count > 0 ? static_cast<int>(sum / static_cast<double>(pixels_count) + 0.5) : 0;
  uint8_t* pixels = image.data();
  for (size_t i = 0, n = byte_count(image); i < n; ++i) pixels[i] = alpha == 0.0f ? mean : blend(mean, pixels[i], alpha);
}

void adjust_saturation(Image& image, double factor) {
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f || image.channels() == 1) return;  // a gray image blends with itself
  uint8_t* pixels = image.data();
  const size_t count = static_cast<size_t>(image.height()) * image.width();
  for (size_t i = 0; i < count; ++i) {
    uint8_t* pixel = pixels + 3 * i;
    const uint8_t luma = pil_luma(pixel);
    for (int c = 0; c < 3; ++c) pixel[c] = alpha == 0.0f ? luma : blend(luma, pixel[c], alpha);
  }
}

void adjust_hue(Image& image, double factor) {
  LOCKSTEP_CHECK(factor >= -0.5 && factor <= 0.5, "adjust_hue: factor ", factor, " is not in [-0.5, 0.5]");
  if (image.channels() == 1) return;
  // numpy's np.uint8(factor * 255): truncated toward zero, then wrapped.
  const auto shift = static_cast<uint8_t>(static_cast<int64_t>(factor * 255));
  uint8_t* pixels = image.data();
  const size_t count = static_cast<size_t>(image.height()) * image.width();
  uint8_t hsv[3];
  for (size_t i = 0; i < count; ++i) {
    uint8_t* pixel = pixels + 3 * i;
    rgb_to_hsv(pixel, hsv);
    hsv[0] = static_cast<uint8_t>(hsv[0] + shift);
    hsv_to_rgb(hsv, pixel);
  }
}

}  // namespace lockstep
