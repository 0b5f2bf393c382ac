#include "lockstep/data/dataset.h"

#include <cstring>

#include <torch/torch.h>

#include "lockstep/core/rng.h"

namespace lockstep {

uint64_t example_seed(uint64_t epoch_seed, int64_t index) {
  return splitmix64(epoch_seed ^ splitmix64(static_cast<uint64_t>(index)));
}

Registry<Dataset>& dataset_registry() {
  static Registry<Dataset> registry("dataset");
  return registry;
}

TensorDataset::TensorDataset(Batch tensors) {
  LOCKSTEP_CHECK(!tensors.empty(), "TensorDataset needs at least one tensor");
  bool first = true;
  for (const auto& item : tensors) {
    const auto& [name, tensor] = item;
    LOCKSTEP_CHECK(tensor.defined(), "TensorDataset: tensor '", name, "' is undefined");
    LOCKSTEP_CHECK(tensor.dim() >= 1, "TensorDataset: tensor '", name,
                   "' is a scalar; every tensor needs a dimension 0 that indexes examples");
    if (first) {
      size_ = tensor.size(0);
      first = false;
    }
    LOCKSTEP_CHECK(tensor.size(0) == size_, "TensorDataset: tensor '", name, "' has ",
                   tensor.size(0), " rows but '", tensors.names().front(), "' has ", size_);
    tensors_.set(name, tensor.contiguous());
  }
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices, uint64_t /*seed*/) const {
  for (size_t i = 0; i < indices.size(); ++i) {
    LOCKSTEP_CHECK(indices[i] >= 0 && indices[i] < size_, "index ", indices[i], " (position ", i,
                   " of the batch) is out of range for a dataset of ", size_, " examples");
  }
  auto index = torch::empty({static_cast<int64_t>(indices.size())}, torch::kLong);
  if (!indices.empty()) std::memcpy(index.data_ptr<int64_t>(), indices.data(), indices.size() * sizeof(int64_t));
  Batch batch;
  for (const auto& [name, tensor] : tensors_) batch.set(name, tensor.index_select(0, index));
  return batch;
}

}  // namespace lockstep
