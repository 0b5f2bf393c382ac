#include "lockstep/model/batch.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep {

Batch::Batch(std::initializer_list<std::pair<std::string, torch::Tensor>> items) {
  for (const auto& item : items) set(item.first, item.second);
}

void Batch::set(const std::string& name, torch::Tensor tensor) {
  for (auto& item : items_) {
    if (item.first == name) {
      item.second = std::move(tensor);
      return;
    }
  }
  items_.emplace_back(name, std::move(tensor));
}

const torch::Tensor& Batch::at(const std::string& name) const {
  for (const auto& item : items_) {
    if (item.first == name) return item.second;
  }
  std::string present;
  for (const auto& item : items_) present += (present.empty() ? "" : ", ") + item.first;
  LOCKSTEP_FAIL("the batch has no tensor named '", name, "'; it holds: ",
                present.empty() ? "(nothing)" : present);
}

bool Batch::contains(const std::string& name) const {
  for (const auto& item : items_) {
    if (item.first == name) return true;
  }
  return false;
}

std::vector<std::string> Batch::names() const {
  std::vector<std::string> result;
  for (const auto& item : items_) result.push_back(item.first);
  return result;
}

int64_t Batch::size() const {
  if (items_.empty() || !items_.front().second.defined() || items_.front().second.dim() == 0) return 0;
  return items_.front().second.size(0);
}

Batch Batch::to(const torch::Device& device, bool non_blocking) const {
  Batch moved;
  for (const auto& item : items_) moved.items_.emplace_back(item.first, item.second.to(device, non_blocking));
  return moved;
}

Batch Batch::pin_memory() const {
  Batch pinned;
  for (const auto& item : items_) {
    const torch::Tensor& tensor = item.second;
    pinned.items_.emplace_back(item.first, tensor.is_cpu() && !tensor.is_pinned() ? tensor.pin_memory() : tensor);
  }
  return pinned;
}

Batch Batch::slice(int64_t start, int64_t length) const {
  Batch part;
  for (const auto& item : items_) part.items_.emplace_back(item.first, item.second.narrow(0, start, length));
  return part;
}

Batch Batch::concat(const std::vector<Batch>& batches) {
  Batch joined;
  if (batches.empty()) return joined;
  for (const auto& item : batches.front().items_) {
    std::vector<torch::Tensor> parts;
    for (const auto& batch : batches) parts.push_back(batch.at(item.first));
    joined.items_.emplace_back(item.first, torch::cat(parts, 0));
  }
  return joined;
}

Batch Batch::cast_floating(c10::optional<torch::Dtype> dtype) const {
  if (!dtype) return *this;
  Batch cast;
  for (const auto& [name, value] : items_) cast.set(name, lockstep::cast_floating(value, dtype));
  return cast;
}

torch::Tensor cast_floating(const torch::Tensor& tensor, c10::optional<torch::Dtype> dtype) {
  if (!dtype || !tensor.defined() || !tensor.is_floating_point() || tensor.scalar_type() == *dtype) return tensor;
  return tensor.to(*dtype);
}

}  // namespace lockstep
