#include "lockstep/optim/internal/foreach_groups.h"

namespace lockstep::detail {

std::vector<std::vector<size_t>> by_device_and_dtype(const std::vector<torch::Tensor>& tensors) {
  std::vector<std::vector<size_t>> parts;
  std::vector<std::pair<torch::Device, torch::ScalarType>> keys;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::pair<torch::Device, torch::ScalarType> key{tensors[i].device(), tensors[i].scalar_type()};
    size_t part = 0;
    while (part < keys.size() && keys[part] != key) ++part;
    if (part == keys.size()) {
      keys.push_back(key);
      parts.emplace_back();
    }
    parts[part].push_back(i);
  }
  return parts;
}

std::vector<torch::Tensor> pick(const std::vector<torch::Tensor>& tensors, const std::vector<size_t>& indices) {
  std::vector<torch::Tensor> picked;
  picked.reserve(indices.size());
  for (size_t i : indices) picked.push_back(tensors[i]);
  return picked;
}

}  // namespace lockstep::detail
