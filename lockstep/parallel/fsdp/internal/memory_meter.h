// fsdp::MemoryMeter: the bytes FSDP's parameters, gradients and optimizer
// state hold on this rank, and their peaks, sampled at every gather, free
// and reduction (FullyShardedDataParallel::memory_stats()).
//
//   fsdp::MemoryMeter meter(model);
//   meter.note_gathered(gathered_units);  // after a gather
//   meter.sample();                       // after anything that allocates or frees
//   meter.stats().peak_total;
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include <torch/torch.h>

#include "lockstep/parallel/fsdp/fsdp_memory_stats.h"
#include "lockstep/parallel/fsdp/internal/sharded_model.h"

namespace lockstep::fsdp {

class MemoryMeter {
 public:
  explicit MemoryMeter(const ShardedModel& model) : model_(model) {}

  // Counts `optimizer`'s state from the next step on.
  void track_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer) { optimizer_ = std::move(optimizer); }
  // After an optimizer step: counts its state when it gained or lost parameters.
  void count_optimizer();
  // Reads the units' current bytes into the stats and raises the peaks.
  void sample();
  // `gathered` units are whole now: raises stats().max_gathered_units.
  void note_gathered(int gathered);
  // Restarts every peak from now (`gathered` units are whole now).
  void reset_peaks(int gathered);
  const FSDPMemoryStats& stats() const { return stats_; }

 private:
  const ShardedModel& model_;
  FSDPMemoryStats stats_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  // (optimizer, its state().size()) when stats_.optimizer was counted.
  std::pair<const void*, size_t> optimizer_counted_{nullptr, 0};
};

}  // namespace lockstep::fsdp
