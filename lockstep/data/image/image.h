// Image: decoded pixels as the image transforms see them, and what they become.
//
// Height × width × channels bytes, channels interleaved (PIL's layout, so
// a transform reads a pixel's channels side by side as PIL's C code does).
// One or three channels: "L" and "RGB" in PIL's words. It becomes a
// C × H × W uint8 tensor only at the end of the pipeline, written straight
// into its slot of the batch.
//
//   lockstep::Image image(/*height=*/2, /*width=*/3, /*channels=*/3);
//   image.at(1, 2)[0] = 255;                          // red of the last pixel
//   lockstep::Image crop = image.crop(/*top=*/0, /*left=*/1, /*height=*/2, /*width=*/2);
//   torch::Tensor chw = torch::empty({3, 2, 2}, torch::kUInt8);
//   crop.write_chw(chw.data_ptr<uint8_t>());
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <string>
#include <vector>

namespace lockstep {

// What the dataset delivers: PIL's convert("L") or convert("RGB") of the file.
enum class ColorMode { kGray, kRGB };

inline int channels_of(ColorMode mode) { return mode == ColorMode::kGray ? 1 : 3; }

class Image {
 public:
  Image() = default;
  Image(int height, int width, int channels);  // zero-filled
  // For code that writes every byte: the pixels start undefined.
  struct Uninitialized {};
  Image(int height, int width, int channels, Uninitialized);

  int height() const { return height_; }
  int width() const { return width_; }
  int channels() const { return channels_; }
  bool empty() const { return pixels_.empty(); }

  uint8_t* row(int y) { return pixels_.data() + static_cast<size_t>(y) * width_ * channels_; }
  const uint8_t* row(int y) const { return pixels_.data() + static_cast<size_t>(y) * width_ * channels_; }
  uint8_t* at(int y, int x) { return row(y) + static_cast<size_t>(x) * channels_; }
  const uint8_t* at(int y, int x) const { return row(y) + static_cast<size_t>(x) * channels_; }
  uint8_t* data() { return pixels_.data(); }
  const uint8_t* data() const { return pixels_.data(); }

  // PIL's Image.crop: the box may reach outside the image; what lies outside
  // is black (0).
  Image crop(int top, int left, int height, int width) const;
  // PIL's FLIP_LEFT_RIGHT, in place.
  void flip_horizontal();
  // PIL's convert("L") of an RGB image (ITU-R 601-2 luma, PIL's fixed point),
  // or convert("RGB") of a gray one (the value in all three channels).
  Image to_channels(int channels) const;

  // Writes channels × height × width bytes (planar) to `out`.
  void write_chw(uint8_t* out) const;

 private:
  // A vector that leaves new bytes uninitialized unless asked (value-initialized).
  struct DefaultInitAllocator : std::allocator<uint8_t> {
    template <typename U>
    struct rebind {
      using other = DefaultInitAllocator;
    };
    template <typename U>
    void construct(U* p) noexcept {
      ::new (static_cast<void*>(p)) U;
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  };
  int height_ = 0, width_ = 0, channels_ = 0;
  std::vector<uint8_t, DefaultInitAllocator> pixels_;
};

// torchvision's padding modes: a fill value, the edge pixel repeated, the
// image mirrored without its edge (numpy's "reflect") or with it ("symmetric").
enum class PadMode { kConstant, kEdge, kReflect, kSymmetric };
PadMode parse_pad_mode(const std::string& name);  // "constant", "edge", "reflect", "symmetric"

// torchvision's F.pad on a PIL image: `left`, `top`, `right`, `bottom` pixels
// added (a negative amount crops that side first); constant padding uses
// `fill` per channel.
Image pad_image(const Image& image, int left, int top, int right, int bottom, PadMode mode,
                const std::array<uint8_t, 3>& fill = {0, 0, 0});

// PIL's luma of one RGB pixel: (R·19595 + G·38470 + B·7471 + 0x8000) >> 16.
inline uint8_t pil_luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

}  // namespace lockstep
