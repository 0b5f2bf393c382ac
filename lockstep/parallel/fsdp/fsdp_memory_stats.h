// FSDPMemoryStats: the bytes FullyShardedDataParallel's parameters, gradients
// and optimizer state hold on this rank, tracked at every gather, free and
// reduction it performs, with their peaks since the last reset.
//
//   auto stats = fsdp->memory_stats();
//   logger().info("peak {} MiB, {} units whole at once", stats.peak_total >> 20, stats.max_gathered_units);
//   fsdp->reset_peak_stats();
#pragma once

#include <cstdint>

namespace lockstep {

struct FSDPMemoryStats {
  int64_t params = 0;      // shards + gathered buffers + unsharded parameters (frozen ones too)
  int64_t grads = 0;       // parameters' own gradients + flat buffers in flight + sharded gradients
  int64_t optimizer = 0;   // optimizer state of the tracked optimizer (measured after each step)
  int64_t peak_params = 0;
  int64_t peak_grads = 0;
  int64_t peak_optimizer = 0;
  int64_t peak_total = 0;  // the largest params + grads + optimizer seen at once
  // The most units gathered at once (units that are never freed -- the root,
  // NO_SHARD, shard groups of one -- excluded).
  int max_gathered_units = 0;
};

}  // namespace lockstep
