// Dataset: where a data loader gets its examples, one whole batch at a time.
//
// A dataset hands out collated batches, not single examples: the loader asks
// for the examples at a list of indices and gets one Batch back, so a dataset
// held in memory answers with one index_select per tensor instead of stacking
// thousands of small tensors per step.
//
//   auto data = std::make_shared<lockstep::TensorDataset>(
//       lockstep::Batch{{"x", torch::randn({100, 3})}, {"y", torch::arange(100)}});
//   lockstep::Batch batch = data->get_batch({4, 7, 1}, /*seed=*/0);   // x: [3, 3], y: [4, 7, 1]
//
//   // From a config section {type: FashionMNIST, split: train}:
//   auto train = lockstep::dataset_registry().build(cfg.at("dataset"));
//
// get_batch is called from the loader's worker threads at the same time, so a
// dataset must be safe to read concurrently; random augmentation draws from
// `seed` (never from a global generator) so a batch does not depend on which
// worker built it. A dataset that augments each example on its own says
// seed_scope() == kEpoch: the loader then passes one seed per epoch, and
// example i draws from example_seed(seed, i), so its augmentation depends on
// (seed, epoch, index) alone, whatever batch, rank or worker it lands in:
//
//   Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override {
//     for (int64_t i : indices) augment(load(i), lockstep::example_seed(seed, i));
//     ...
//   }
//   SeedScope seed_scope() const override { return SeedScope::kEpoch; }
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/config/registry.h"
#include "lockstep/model/batch.h"

namespace lockstep {

// What the seed a DataLoader passes to get_batch stands for.
enum class SeedScope {
  kBatch,  // one seed per batch: batch_seed(loader seed, epoch, batch_in_epoch)
  kEpoch,  // one seed per epoch, for per-example seeds: epoch_seed(loader seed, epoch)
};

// The seed of example `index` under an epoch's seed (splitmix64 of the two).
uint64_t example_seed(uint64_t epoch_seed, int64_t index);

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The examples at `indices`, collated into one Batch (dim 0 = indices.size()).
  // `seed` is a deterministic per-batch seed for random augmentation (datasets
  // without augmentation ignore it); the same (indices, seed) gives the same batch.
  // A dataset may return fewer rows than indices when it is configured to
  // skip unreadable examples; the loader counts and logs the difference.
  virtual Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const = 0;
  virtual SeedScope seed_scope() const { return SeedScope::kBatch; }
};

// Datasets by type name: {type: FashionMNIST, root: ..., split: train}.
Registry<Dataset>& dataset_registry();

// Named tensors that share dimension 0; example i is row i of each. For tests,
// synthetic data and anything already in memory.
class TensorDataset : public Dataset {
 public:
  // Every tensor needs at least one dimension and the same size(0). They are
  // made contiguous once here so that every batch is a plain gather.
  explicit TensorDataset(Batch tensors);

  int64_t size() const override { return size_; }
  Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override;
  const Batch& tensors() const { return tensors_; }

 private:
  Batch tensors_;
  int64_t size_ = 0;
};

}  // namespace lockstep
