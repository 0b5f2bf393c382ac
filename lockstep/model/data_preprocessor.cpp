#include "lockstep/model/data_preprocessor.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/model/memory_format.h"

namespace lockstep {

Batch DataPreprocessor::operator()(const Batch& batch, bool training) const {
  Batch result = transform(batch, training);
  if (!input_dtype_ && !input_memory_format_) return result;
  Batch converted;
  for (const auto& [name, value] : result) {
    torch::Tensor input = cast_floating(value, input_dtype_);
    if (input.is_floating_point() && input_memory_format_ && memory_format_applies(input, *input_memory_format_)) {
      input = in_memory_format(input, *input_memory_format_);
    }
    converted.set(name, input);
  }
  return converted;
}

Batch DataPreprocessor::transform(const Batch& batch, bool /*training*/) const {
  return batch.to(device_, /*non_blocking=*/device_.is_cuda());
}

ImgDataPreprocessor::ImgDataPreprocessor(std::vector<double> mean, std::vector<double> std, std::string key)
    : key_(std::move(key)), mean_(std::move(mean)), std_(std::move(std)) {
  LOCKSTEP_CHECK(mean_.size() == std_.size(), "ImgDataPreprocessor: mean has ", mean_.size(),
                 " channels but std has ", std_.size());
  for (double s : std_) LOCKSTEP_CHECK(s > 0, "ImgDataPreprocessor: std must be positive, got ", s);
}

Batch ImgDataPreprocessor::transform(const Batch& batch, bool training) const {
  Batch moved = DataPreprocessor::transform(batch, training);
  torch::Tensor image = moved.at(key_).to(torch::kFloat);
  if (!mean_.empty()) {
    LOCKSTEP_CHECK(image.dim() >= 2 && image.size(1) == static_cast<int64_t>(mean_.size()),
                   "ImgDataPreprocessor: '", key_, "' has shape ", image.sizes(), " but mean/std give ",
                   mean_.size(), " channels");
    std::vector<int64_t> shape(image.dim(), 1);
    shape[1] = static_cast<int64_t>(mean_.size());
    // Made once per device: a host-to-device copy each step would cost a
    // synchronisation, and is one thing a captured step (cuda_graph) must not do.
    if (!mean_on_device_.defined() || mean_on_device_.device() != image.device()) {
      auto options = torch::TensorOptions().dtype(torch::kFloat).device(image.device());
      mean_on_device_ = torch::tensor(std::vector<float>(mean_.begin(), mean_.end()), options);
      std_on_device_ = torch::tensor(std::vector<float>(std_.begin(), std_.end()), options);
    }
    image = (image - mean_on_device_.view(shape)) / std_on_device_.view(shape);
  }
  moved.set(key_, image);
  return moved;
}

Registry<DataPreprocessor>& data_preprocessor_registry() {
  static Registry<DataPreprocessor> registry("data preprocessor");
  return registry;
}

LOCKSTEP_REGISTER(data_preprocessor_registry(), "BaseDataPreprocessor",
                  [](const Config&) { return std::make_shared<DataPreprocessor>(); });
LOCKSTEP_REGISTER(data_preprocessor_registry(), "ImgDataPreprocessor", [](const Config& config) {
  return std::make_shared<ImgDataPreprocessor>(config.get<std::vector<double>>("mean", {}),
                                               config.get<std::vector<double>>("std", {}),
                                               config.get<std::string>("key", "image"));
});

}  // namespace lockstep
