// MemoryStatsHook: memory use written to the metrics every `interval` iterations.
//
// The process's resident memory and its peak (memory/rss_mib,
// memory/peak_rss_mib) and, on a GPU, the CUDA caching allocator's counters
// for the rank's device (memory/cuda_allocated_mib, cuda_reserved_mib,
// cuda_peak_allocated_mib, cuda_peak_reserved_mib). The logger and the
// writers publish them with the other scalars (each rank's own values).
//
//   custom_hooks:
//     - {type: MemoryStatsHook, interval: 50}
#pragma once

#include "lockstep/engine/hook.h"

namespace lockstep {

class MemoryStatsHook : public Hook {
 public:
  // `cuda_device`: the rank's GPU, or -1 on CPU.
  explicit MemoryStatsHook(int64_t interval = 50, int cuda_device = -1);
  void after_step() override;

 private:
  int64_t interval_;
  int cuda_device_;
};

}  // namespace lockstep
