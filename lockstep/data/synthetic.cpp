#include "lockstep/data/synthetic.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

Batch make_images(const SyntheticImagesOptions& options) {
  LOCKSTEP_CHECK(options.size() > 0 && options.channels() > 0 && options.height() > 0 && options.width() > 0,
                 "SyntheticImages: size, channels, height and width must be positive");
  LOCKSTEP_CHECK(options.num_classes() >= 2, "SyntheticImages: num_classes must be at least 2");
  torch::Generator generator = at::detail::createCPUGenerator(options.seed());
  auto shape = std::vector<int64_t>{options.channels(), options.height(), options.width()};
  std::vector<int64_t> pattern_shape{options.num_classes()};
  pattern_shape.insert(pattern_shape.end(), shape.begin(), shape.end());
  torch::Tensor patterns = torch::rand(pattern_shape, generator) * 200.0;
  torch::Tensor labels = torch::randint(0, options.num_classes(), {options.size()}, generator, torch::kLong);
  std::vector<int64_t> image_shape{options.size()};
  image_shape.insert(image_shape.end(), shape.begin(), shape.end());
  torch::Tensor noise = torch::randn(image_shape, generator) * 40.0;
  torch::Tensor images = (patterns.index_select(0, labels) + noise).clamp(0, 255).to(torch::kUInt8);
  return Batch{{"image", images}, {"label", labels}};
}

}  // namespace

SyntheticImages::SyntheticImages(const SyntheticImagesOptions& options) : TensorDataset(make_images(options)) {}

LOCKSTEP_REGISTER(dataset_registry(), "SyntheticImages", [](const Config& config) {
  return std::make_shared<SyntheticImages>(SyntheticImagesOptions()
                                               .size(config.get<int64_t>("size", 1024))
                                               .channels(config.get<int64_t>("channels", 1))
                                               .height(config.get<int64_t>("height", 28))
                                               .width(config.get<int64_t>("width", 28))
                                               .num_classes(config.get<int64_t>("num_classes", 10))
                                               .seed(static_cast<uint64_t>(config.get<int64_t>("seed", 0))));
});

}  // namespace lockstep
