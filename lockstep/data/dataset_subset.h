// The `indices` key of a dataset section, as mmengine's BaseDataset reads it:
// train or evaluate on part of a dataset without another copy of its files.
//
//   train_dataloader:
//     dataset: {type: FashionMNIST, split: train, indices: 12000}      # the first 12000 examples
//     dataset: {type: FashionMNIST, split: train, indices: [0, 5, 9]}  # these three, in this order
//
//   auto all = lockstep::dataset_registry().build(cfg);
//   auto part = lockstep::subset_from_config(all, cfg.child("indices"));  // `all` itself when absent
//
// Example i of the subset is example indices[i] of the whole, so a sampler,
// a per-example augmentation seed (example_seed) and an index log all speak
// of positions in the subset.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/data/dataset.h"

namespace lockstep {

class DatasetSubset : public Dataset {
 public:
  // Every index must lie in [0, whole->size()); repeats are allowed.
  DatasetSubset(std::shared_ptr<Dataset> whole, std::vector<int64_t> indices);

  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override;
  SeedScope seed_scope() const override { return whole_->seed_scope(); }

 private:
  std::shared_ptr<Dataset> whole_;
  std::vector<int64_t> indices_;
};

// `indices` null: `whole` unchanged; a number N: its first N examples (at
// most its size, at least 1); a list: those examples. Errors name the key.
std::shared_ptr<Dataset> subset_from_config(std::shared_ptr<Dataset> whole, const Config& indices);

}  // namespace lockstep
