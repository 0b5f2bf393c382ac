#include "lockstep/data/image/transforms.h"

#include <cmath>
#include <limits>

#include "lockstep/data/image/color.h"

namespace lockstep {
namespace {

// Python's int(round(x)): halves to even.
int python_round(double x) { return static_cast<int>(std::nearbyint(x)); }

// ---- config readers --------------------------------------------------------

std::vector<int> read_size_list(const Config& cfg, const std::string& key) {
  const Config node = cfg.at(key);
  std::vector<int> size = node.is_sequence() ? node.as<std::vector<int>>() : std::vector<int>{node.as<int>()};
  LOCKSTEP_CHECK(size.size() == 1 || size.size() == 2, cfg.where(key), ": ", key,
                 " is an int or [height, width], got ", size.size(), " values");
  for (int value : size) LOCKSTEP_CHECK(value > 0, cfg.where(key), ": ", key, " must be positive, got ", value);
  return size;
}

ImageSize read_size(const Config& cfg, const std::string& key) {
  const std::vector<int> size = read_size_list(cfg, key);
  return size.size() == 1 ? ImageSize{size[0], size[0]} : ImageSize{size[0], size[1]};
}

Interpolation read_interpolation(const Config& cfg) {
  const auto name = cfg.get<std::string>("interpolation", "bilinear");
  try {
    return parse_interpolation(name);
  } catch (const Error& error) {
    LOCKSTEP_FAIL(cfg.where("interpolation"), ": ", error.what());
  }
}

std::array<double, 2> read_pair(const Config& cfg, const std::string& key, std::array<double, 2> fallback) {
  if (!cfg.has(key)) return fallback;
  const auto values = cfg.get<std::vector<double>>(key);
  LOCKSTEP_CHECK(values.size() == 2 && values[0] <= values[1], cfg.where(key), ": ", key,
                 " is [min, max] with min <= max");
  return {values[0], values[1]};
}

// torchvision's padding: an int (all sides), [left/right, top/bottom] or [left, top, right, bottom].
Padding read_padding(const Config& cfg, const std::string& key) {
  const Config node = cfg.at(key);
  const std::vector<int> values = node.is_sequence() ? node.as<std::vector<int>>() : std::vector<int>{node.as<int>()};
  if (values.size() == 1) return {values[0], values[0], values[0], values[0]};
  if (values.size() == 2) return {values[0], values[1], values[0], values[1]};
  LOCKSTEP_CHECK(values.size() == 4, cfg.where(key), ": ", key,
                 " is an int, [left/right, top/bottom] or [left, top, right, bottom], got ", values.size(), " values");
  return {values[0], values[1], values[2], values[3]};
}

std::array<uint8_t, 3> read_fill(const Config& cfg) {
  if (!cfg.has("fill")) return {0, 0, 0};
  const Config node = cfg.at("fill");
  std::vector<int> values = node.is_sequence() ? node.as<std::vector<int>>() : std::vector<int>{node.as<int>()};
  LOCKSTEP_CHECK(values.size() == 1 || values.size() == 3, cfg.where("fill"), ": fill is one value or three (R, G, B)");
  if (values.size() == 1) values.assign(3, values[0]);
  std::array<uint8_t, 3> fill{};
  for (int c = 0; c < 3; ++c) {
    LOCKSTEP_CHECK(values[c] >= 0 && values[c] <= 255, cfg.where("fill"), ": fill values are 0..255, got ", values[c]);
    fill[c] = static_cast<uint8_t>(values[c]);
  }
  return fill;
}

PadMode read_pad_mode(const Config& cfg) {
  try {
    return parse_pad_mode(cfg.get<std::string>("padding_mode", "constant"));
  } catch (const Error& error) {
    LOCKSTEP_FAIL(cfg.where("padding_mode"), ": ", error.what());
  }
}

// torchvision's ColorJitter._check_input: a number v gives [center - v, center + v]
// (clamped at 0 for factors), a pair is taken as is; [center, center] means off.
ColorJitter::Range read_jitter(const Config& cfg, const std::string& key, double center, double low, double high) {
  if (!cfg.has(key)) return std::nullopt;
  const Config node = cfg.at(key);
  std::array<double, 2> range;
  if (node.is_sequence()) {
    const auto values = node.as<std::vector<double>>();
    LOCKSTEP_CHECK(values.size() == 2, cfg.where(key), ": ", key, " is a number or [min, max]");
    range = {values[0], values[1]};
  } else {
    const double value = node.as<double>();
    LOCKSTEP_CHECK(value >= 0, cfg.where(key), ": ", key, " must be non-negative, got ", value);
    range = {center - value, center + value};
    if (center == 1.0) range[0] = std::max(range[0], 0.0);
  }
  LOCKSTEP_CHECK(low <= range[0] && range[0] <= range[1] && range[1] <= high, cfg.where(key), ": ", key,
                 " values should be between ", low, " and ", high, " with min <= max, got [", range[0], ", ",
                 range[1], "]");
  if (range[0] == center && range[1] == center) return std::nullopt;
  return range;
}

void resize_unless_same(ImageSample& sample, ImageSize size, Interpolation interpolation) {
  // F.resize returns the image itself when it already has the size.
  if (sample.height() == size.height && sample.width() == size.width) return;
  sample.resize(size.height, size.width, interpolation);
}

}  // namespace

Registry<ImageTransform>& image_transform_registry() {
  static Registry<ImageTransform> registry("image transform");
  return registry;
}

ImageSize resized_output_size(int height, int width, const std::vector<int>& size, std::optional<int> max_size) {
  if (size.size() == 2) return {size[0], size[1]};
  const int shorter = std::min(height, width), longer = std::max(height, width);
  int new_short = size[0];
  int new_long = static_cast<int>(static_cast<double>(size[0]) * longer / shorter);
  if (max_size) {
    LOCKSTEP_CHECK(*max_size > size[0], "Resize: max_size = ", *max_size,
                   " must be strictly greater than the requested size for the smaller edge, ", size[0]);
    if (new_long > *max_size) {
      new_short = static_cast<int>(static_cast<double>(*max_size) * new_short / new_long);
      new_long = *max_size;
    }
  }
  return width <= height ? ImageSize{new_long, new_short} : ImageSize{new_short, new_long};
}

Resize::Resize(std::vector<int> size, Interpolation interpolation, std::optional<int> max_size)
    : size_(std::move(size)), interpolation_(interpolation), max_size_(max_size) {
  LOCKSTEP_CHECK(size_.size() == 1 || size_.size() == 2, "Resize: size is one value or [height, width]");
  LOCKSTEP_CHECK(!max_size_ || size_.size() == 1, "Resize: max_size needs a size of one value (the smaller edge)");
}

void Resize::apply(ImageSample& sample, SampleRandom&) const {
  resize_unless_same(sample, resized_output_size(sample.height(), sample.width(), size_, max_size_), interpolation_);
}

void CenterCrop::apply(ImageSample& sample, SampleRandom&) const {
  int height = sample.height(), width = sample.width();
  if (size_.width > width || size_.height > height) {
    const int left = size_.width > width ? (size_.width - width) / 2 : 0;
    const int top = size_.height > height ? (size_.height - height) / 2 : 0;
    const int right = size_.width > width ? (size_.width - width + 1) / 2 : 0;
    const int bottom = size_.height > height ? (size_.height - height + 1) / 2 : 0;
    Image& pixels = sample.pixels();
    pixels = pad_image(pixels, left, top, right, bottom, PadMode::kConstant);
    height = pixels.height();
    width = pixels.width();
    if (size_.width == width && size_.height == height) return;
  }
  sample.crop(python_round((height - size_.height) / 2.0), python_round((width - size_.width) / 2.0), size_.height,
              size_.width);
}

RandomResizedCrop::RandomResizedCrop(ImageSize size, std::array<double, 2> scale, std::array<double, 2> ratio,
                                     Interpolation interpolation)
    : size_(size), scale_(scale), ratio_(ratio), interpolation_(interpolation) {
  LOCKSTEP_CHECK(scale_[0] > 0 && scale_[0] <= scale_[1], "RandomResizedCrop: scale must be (min, max) with 0 < min <= max");
  LOCKSTEP_CHECK(ratio_[0] > 0 && ratio_[0] <= ratio_[1], "RandomResizedCrop: ratio must be (min, max) with 0 < min <= max");
}

CropBox RandomResizedCrop::draw_box(int height, int width, SampleRandom& random) const {
  const double area = static_cast<double>(height) * width;
  const double log_low = std::log(ratio_[0]), log_high = std::log(ratio_[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * random.uniform(scale_[0], scale_[1]);
    const double aspect_ratio = std::exp(random.uniform(log_low, log_high));
    const int w = python_round(std::sqrt(target_area * aspect_ratio));
    const int h = python_round(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int top = static_cast<int>(random.integer(0, height - h + 1));
      const int left = static_cast<int>(random.integer(0, width - w + 1));
      return {top, left, h, w};
    }
  }
  // The central fallback.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < ratio_[0]) {
    h = python_round(w / ratio_[0]);
  } else if (in_ratio > ratio_[1]) {
    w = python_round(h * ratio_[1]);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

void RandomResizedCrop::apply(ImageSample& sample, SampleRandom& random) const {
  const CropBox box = draw_box(sample.height(), sample.width(), random);
  sample.crop(box.top, box.left, box.height, box.width);
  resize_unless_same(sample, size_, interpolation_);
}

void Pad::apply(ImageSample& sample, SampleRandom&) const {
  Image& pixels = sample.pixels();
  pixels = pad_image(pixels, padding_[0], padding_[1], padding_[2], padding_[3], mode_, fill_);
}

RandomCrop::RandomCrop(ImageSize size, std::optional<Padding> padding, bool pad_if_needed,
                       std::array<uint8_t, 3> fill, PadMode mode)
    : size_(size), padding_(padding), pad_if_needed_(pad_if_needed), fill_(fill), mode_(mode) {}

void RandomCrop::apply(ImageSample& sample, SampleRandom& random) const {
  if (padding_) Pad(*padding_, fill_, mode_).apply(sample, random);
  // torchvision pads by the whole shortfall on both sides.
  if (pad_if_needed_ && sample.width() < size_.width) {
    const int extra = size_.width - sample.width();
    Pad({extra, 0, extra, 0}, fill_, mode_).apply(sample, random);
  }
  if (pad_if_needed_ && sample.height() < size_.height) {
    const int extra = size_.height - sample.height();
    Pad({0, extra, 0, extra}, fill_, mode_).apply(sample, random);
  }
  const int height = sample.height(), width = sample.width();
  LOCKSTEP_CHECK(height >= size_.height && width >= size_.width, "RandomCrop: required crop size (",
                 size_.height, ", ", size_.width, ") is larger than the input image size (", height, ", ", width,
                 "); set pad_if_needed: true or add a Resize before it");
  if (height == size_.height && width == size_.width) return;
  const int top = static_cast<int>(random.integer(0, height - size_.height + 1));
  const int left = static_cast<int>(random.integer(0, width - size_.width + 1));
  sample.crop(top, left, size_.height, size_.width);
}

void RandomHorizontalFlip::apply(ImageSample& sample, SampleRandom& random) const {
  if (random.uniform(0.0, 1.0) < p_) sample.pixels().flip_horizontal();
}

ColorJitter::ColorJitter(Range brightness, Range contrast, Range saturation, Range hue)
    : brightness_(brightness), contrast_(contrast), saturation_(saturation), hue_(hue) {}

void ColorJitter::apply(ImageSample& sample, SampleRandom& random) const {
  // torchvision's get_params: the order first, then each factor in turn.
  const std::vector<int> order = random.permutation(4);
  auto draw = [&](const Range& range) { return range ? random.uniform((*range)[0], (*range)[1]) : 0.0; };
  const double brightness = draw(brightness_), contrast = draw(contrast_), saturation = draw(saturation_),
               hue = draw(hue_);
  for (int step : order) {
    if (step == 0 && brightness_) adjust_brightness(sample.pixels(), brightness);
    if (step == 1 && contrast_) adjust_contrast(sample.pixels(), contrast);
    if (step == 2 && saturation_) adjust_saturation(sample.pixels(), saturation);
    if (step == 3 && hue_) adjust_hue(sample.pixels(), hue);
  }
}

ImagePipeline ImagePipeline::build(const Config& cfg) {
  if (cfg.is_null()) return {};
  LOCKSTEP_CHECK(cfg.is_sequence(), cfg.where(), ": pipeline is a list of transforms ({type: ...} maps)");
  std::vector<std::shared_ptr<const ImageTransform>> transforms;
  for (size_t i = 0; i < cfg.size(); ++i) transforms.push_back(image_transform_registry().build(cfg.at(i)));
  return ImagePipeline(std::move(transforms));
}

Image ImagePipeline::run(ImageSample& sample, uint64_t seed) const {
  SampleRandom random(seed);
  for (const auto& transform : transforms_) transform->apply(sample, random);
  return sample.take();
}

LOCKSTEP_REGISTER(image_transform_registry(), "Resize", [](const Config& cfg) {
  std::optional<int> max_size;
  if (cfg.has("max_size") && !cfg.at("max_size").is_null()) max_size = cfg.get<int>("max_size");
  const std::vector<int> size = read_size_list(cfg, "size");
  LOCKSTEP_CHECK(!max_size || size.size() == 1, cfg.where("max_size"),
                 ": max_size needs a size of one value (the smaller edge)");
  LOCKSTEP_CHECK(!max_size || *max_size > size[0], cfg.where("max_size"), ": max_size = ", *max_size,
                 " must be greater than size ", size[0]);
  return std::make_shared<Resize>(size, read_interpolation(cfg), max_size);
});

LOCKSTEP_REGISTER(image_transform_registry(), "CenterCrop",
                  [](const Config& cfg) { return std::make_shared<CenterCrop>(read_size(cfg, "size")); });

LOCKSTEP_REGISTER(image_transform_registry(), "RandomResizedCrop", [](const Config& cfg) {
  const auto scale = read_pair(cfg, "scale", {0.08, 1.0});
  const auto ratio = read_pair(cfg, "ratio", {3.0 / 4.0, 4.0 / 3.0});
  LOCKSTEP_CHECK(scale[0] > 0, cfg.where("scale"), ": scale must be positive");
  LOCKSTEP_CHECK(ratio[0] > 0, cfg.where("ratio"), ": ratio must be positive");
  return std::make_shared<RandomResizedCrop>(read_size(cfg, "size"), scale, ratio, read_interpolation(cfg));
});

LOCKSTEP_REGISTER(image_transform_registry(), "RandomCrop", [](const Config& cfg) {
  std::optional<Padding> padding;
  if (cfg.has("padding") && !cfg.at("padding").is_null()) padding = read_padding(cfg, "padding");
  return std::make_shared<RandomCrop>(read_size(cfg, "size"), padding, cfg.get<bool>("pad_if_needed", false),
                                      read_fill(cfg), read_pad_mode(cfg));
});

LOCKSTEP_REGISTER(image_transform_registry(), "Pad", [](const Config& cfg) {
  return std::make_shared<Pad>(read_padding(cfg, "padding"), read_fill(cfg), read_pad_mode(cfg));
});

LOCKSTEP_REGISTER(image_transform_registry(), "RandomHorizontalFlip", [](const Config& cfg) {
  const double p = cfg.get<double>("p", 0.5);
  LOCKSTEP_CHECK(p >= 0 && p <= 1, cfg.where("p"), ": p is a probability, got ", p);
  return std::make_shared<RandomHorizontalFlip>(p);
});

LOCKSTEP_REGISTER(image_transform_registry(), "ColorJitter", [](const Config& cfg) {
  const double inf = std::numeric_limits<double>::infinity();
  return std::make_shared<ColorJitter>(read_jitter(cfg, "brightness", 1.0, 0.0, inf),
                                       read_jitter(cfg, "contrast", 1.0, 0.0, inf),
                                       read_jitter(cfg, "saturation", 1.0, 0.0, inf),
                                       read_jitter(cfg, "hue", 0.0, -0.5, 0.5));
});

}  // namespace lockstep
