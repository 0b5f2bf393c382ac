// Image transforms with torchvision's semantics, and the pipeline that runs them.
//
// Each transform is torchvision's (0.14) transform of the same name applied
// to a PIL image: the same parameters, the same geometry and Pillow's pixel
// arithmetic, so a fixed crop box, flip or colour factor gives torchvision's
// bytes. Only the random draws differ: they come from the example's own
// SampleRandom, never from a global generator. Normalisation is not here: it
// belongs to the model's data preprocessor, on the device.
//
//   # in a dataset config
//   pipeline:
//     - {type: RandomResizedCrop, size: 224, scale: [0.08, 1.0], ratio: [0.75, 1.3333]}
//     - {type: RandomHorizontalFlip, p: 0.5}
//     - {type: ColorJitter, brightness: 0.4, contrast: 0.4, saturation: 0.4, hue: 0.1}
//
//   lockstep::ImagePipeline pipeline = lockstep::ImagePipeline::build(cfg.at("pipeline"));
//   lockstep::ImageSample sample(bytes, size, lockstep::ColorMode::kRGB);
//   lockstep::Image image = pipeline.run(sample, /*seed=*/example_seed);
//
// Transforms: Resize {size, interpolation, max_size}, CenterCrop {size},
// RandomResizedCrop {size, scale, ratio, interpolation}, RandomCrop {size,
// padding, pad_if_needed, fill, padding_mode}, RandomHorizontalFlip {p},
// Pad {padding, fill, padding_mode}, ColorJitter {brightness, contrast,
// saturation, hue}. `size` is an int (a square; for Resize, the smaller
// edge) or [height, width]; `interpolation` is bilinear (default), bicubic
// or nearest.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/config/registry.h"
#include "lockstep/data/image/image_sample.h"
#include "lockstep/data/image/sample_random.h"

namespace lockstep {

class ImageTransform {
 public:
  virtual ~ImageTransform() = default;
  virtual void apply(ImageSample& sample, SampleRandom& random) const = 0;
};

Registry<ImageTransform>& image_transform_registry();

// A crop or output size: height and width.
struct ImageSize {
  int height = 0, width = 0;
};

// torchvision's _compute_resized_output_size: `size` with one entry matches
// the smaller edge (the other keeps the aspect ratio, truncated), two are
// [height, width]; max_size bounds the longer edge.
ImageSize resized_output_size(int height, int width, const std::vector<int>& size, std::optional<int> max_size);

class Resize : public ImageTransform {
 public:
  explicit Resize(std::vector<int> size, Interpolation interpolation = Interpolation::kBilinear,
                  std::optional<int> max_size = std::nullopt);
  void apply(ImageSample& sample, SampleRandom& random) const override;

 private:
  std::vector<int> size_;
  Interpolation interpolation_;
  std::optional<int> max_size_;
};

class CenterCrop : public ImageTransform {
 public:
  explicit CenterCrop(ImageSize size) : size_(size) {}
  void apply(ImageSample& sample, SampleRandom& random) const override;

 private:
  ImageSize size_;
};

// The crop box RandomResizedCrop draws: top, left, height, width.
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
};

class RandomResizedCrop : public ImageTransform {
 public:
  explicit RandomResizedCrop(ImageSize size, std::array<double, 2> scale = {0.08, 1.0},
                             std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0},
                             Interpolation interpolation = Interpolation::kBilinear);
  void apply(ImageSample& sample, SampleRandom& random) const override;
  // torchvision's get_params: up to 10 draws of (area, log-ratio), then the
  // central fallback.
  CropBox draw_box(int height, int width, SampleRandom& random) const;

 private:
  ImageSize size_;
  std::array<double, 2> scale_, ratio_;
  Interpolation interpolation_;
};

// Padding amounts: left, top, right, bottom.
using Padding = std::array<int, 4>;

class Pad : public ImageTransform {
 public:
  Pad(Padding padding, std::array<uint8_t, 3> fill = {0, 0, 0}, PadMode mode = PadMode::kConstant)
      : padding_(padding), fill_(fill), mode_(mode) {}
  void apply(ImageSample& sample, SampleRandom& random) const override;

 private:
  Padding padding_;
  std::array<uint8_t, 3> fill_;
  PadMode mode_;
};

class RandomCrop : public ImageTransform {
 public:
  RandomCrop(ImageSize size, std::optional<Padding> padding = std::nullopt, bool pad_if_needed = false,
             std::array<uint8_t, 3> fill = {0, 0, 0}, PadMode mode = PadMode::kConstant);
  void apply(ImageSample& sample, SampleRandom& random) const override;

 private:
  ImageSize size_;
  std::optional<Padding> padding_;
  bool pad_if_needed_;
  std::array<uint8_t, 3> fill_;
  PadMode mode_;
};

class RandomHorizontalFlip : public ImageTransform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5) : p_(p) {}
  void apply(ImageSample& sample, SampleRandom& random) const override;

 private:
  double p_;
};

class ColorJitter : public ImageTransform {
 public:
  // Each range is [min, max] of the factor (hue: of the shift); nullopt leaves it out.
  using Range = std::optional<std::array<double, 2>>;
  ColorJitter(Range brightness, Range contrast, Range saturation, Range hue);
  void apply(ImageSample& sample, SampleRandom& random) const override;

 private:
  Range brightness_, contrast_, saturation_, hue_;
};

// The transforms of a dataset's `pipeline`, in order.
class ImagePipeline {
 public:
  ImagePipeline() = default;
  explicit ImagePipeline(std::vector<std::shared_ptr<const ImageTransform>> transforms)
      : transforms_(std::move(transforms)) {}
  // From a sequence of {type: ...} maps (a null config is the empty pipeline).
  static ImagePipeline build(const Config& cfg);

  // Runs every transform with draws from SampleRandom(seed); returns the pixels.
  Image run(ImageSample& sample, uint64_t seed) const;
  size_t size() const { return transforms_.size(); }

 private:
  std::vector<std::shared_ptr<const ImageTransform>> transforms_;
};

}  // namespace lockstep
