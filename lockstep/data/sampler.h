// Samplers: which dataset indices this rank visits, epoch by epoch.
//
// A sampler is a pure function of (epoch, its settings): it keeps no cursor, so
// any epoch can be asked for at any time (resume, evaluation, several loaders)
// and every rank computes the same permutation without talking to the others.
// Semantics follow mmengine's DefaultSampler / InfiniteSampler:
//
//   lockstep::DefaultSampler sampler(/*size=*/10, /*shuffle=*/true, /*seed=*/42, /*rank=*/1, /*world=*/3);
//   sampler.num_samples();          // 4 = ceil(10 / 3)
//   sampler.epoch_indices(0);       // padded[1], padded[4], padded[7], padded[10]
//   //   where padded = randperm(10; seed 42 + epoch 0) followed by its first 2 entries again
//
//   // From a config section {type: DefaultSampler, shuffle: true} (`seed` overrides ctx.seed):
//   auto s = lockstep::sampler_registry().build(cfg.at("sampler"), dataset->size(), ctx);
//
// The permutation of epoch e is torch::randperm(size) drawn from a private CPU
// generator seeded with seed + e, never from global RNG state: the draw that
// mmengine makes in Python with `torch.Generator().manual_seed(seed + e)`.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "lockstep/config/registry.h"

namespace lockstep {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // This rank's share of `epoch`, in visiting order (num_samples() entries).
  virtual std::vector<int64_t> epoch_indices(int64_t epoch) const = 0;
  // Entries per epoch on this rank.
  virtual int64_t num_samples() const = 0;
  // True when epochs are only a way to number an endless stream: loader
  // batches then straddle epoch boundaries instead of ending short.
  virtual bool infinite() const { return false; }

  // Resuming at another world size (DataLoader::load_state). An epoch has a
  // global order that the ranks walk together: after each rank has taken k
  // entries of its share, the first k * world entries of the order are done.
  // The ranks this sampler shares an epoch among.
  virtual int world_size() const { return 1; }
  // Entries of one epoch's order that are distinct samples (before padding).
  virtual int64_t epoch_length() const { return num_samples(); }
  // This rank's share of `epoch`'s order from entry `done` on, shared among
  // world_size() ranks as a whole epoch is; nullopt when the sampler cannot
  // (the loader then refuses to resume at another world size).
  virtual std::optional<std::vector<int64_t>> rest_of_epoch(int64_t epoch, int64_t done) const {
    (void)epoch;
    (void)done;
    return std::nullopt;
  }
};

// What a sampler factory learns from the run rather than from its config.
struct SamplerContext {
  int rank = 0;
  int world_size = 1;
  uint64_t seed = 0;  // the run's seed, identical on every rank; a `seed` key in the config overrides it
};

Registry<Sampler, int64_t /*dataset size*/, const SamplerContext&>& sampler_registry();

// 0 .. size-1 in order; rank takes every world-th index from `rank`, so shares
// are uneven and nothing repeats (single-process work and plain evaluation).
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t size, int rank = 0, int world = 1);
  std::vector<int64_t> epoch_indices(int64_t epoch) const override;
  int64_t num_samples() const override;

 private:
  int64_t size_;
  int rank_, world_;
};

// mmengine's DefaultSampler. With round_up (training), the epoch's permutation
// is padded by repeating it from the start until its length divides by world,
// so every rank gets ceil(size / world) indices and collectives stay in step.
// Without round_up (evaluation), ranks get uneven shares and nothing repeats.
// Either way rank r takes entries r, r + world, r + 2 world, ...
class DefaultSampler : public Sampler {
 public:
  DefaultSampler(int64_t size, bool shuffle, uint64_t seed, int rank = 0, int world = 1, bool round_up = true);
  std::vector<int64_t> epoch_indices(int64_t epoch) const override;
  int64_t num_samples() const override;

  // The whole epoch's order before padding and sharding, identical on all ranks.
  std::vector<int64_t> permutation(int64_t epoch) const;

  int world_size() const override { return world_; }
  int64_t epoch_length() const override { return size_; }
  // permutation(epoch)[done:], padded (with round_up) by repeating it from its
  // start until its length divides by world, then rank r takes entries r,
  // r + world, ...: what the epoch would be if it had been this short.
  std::optional<std::vector<int64_t>> rest_of_epoch(int64_t epoch, int64_t done) const override;

 private:
  int64_t size_;
  bool shuffle_;
  uint64_t seed_;
  int rank_, world_;
  bool round_up_;
};

// mmengine's InfiniteSampler, for iteration-based training: an endless stream
// made of successive epoch permutations, each padded and sharded like
// DefaultSampler with round_up. Loader batches straddle epoch boundaries.
class InfiniteSampler : public DefaultSampler {
 public:
  InfiniteSampler(int64_t size, bool shuffle, uint64_t seed, int rank = 0, int world = 1)
      : DefaultSampler(size, shuffle, seed, rank, world, /*round_up=*/true) {}
  bool infinite() const override { return true; }
  // Batches straddle epochs: a stream is not cut at an epoch's end.
  std::optional<std::vector<int64_t>> rest_of_epoch(int64_t, int64_t) const override { return std::nullopt; }
};

}  // namespace lockstep
