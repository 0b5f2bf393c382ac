#include "lockstep/core/host_memory_policy.h"

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace lockstep {

// Note [Freed activations stay in the process]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CPU training step allocates its activations and gradients (tens of MB for
// the demo's CNN at batch 64) and frees them all before the next step, which
// allocates the same sizes again. glibc serves a block above its mmap
// threshold with a mapping of its own, unmapped on free, and gives the top of
// the heap back to the kernel once more than its trim threshold is free. Both
// thresholds start low (128 KiB, 256 KiB) and only adapt upward as blocks are
// freed, so every step asked the kernel for fresh zeroed pages: a rank of
// the demo with SyncBatchNorm (2 ranks, one thread each) took 370,824 page
// faults in 5 s, about 9,000 a step, near a tenth of its CPU time faulting
// and zeroing pages; with the thresholds raised, none, and 0.119 s a step
// instead of 0.126 (BENCHMARKS.md, "Freed activations stay in the process").
//
// Raising both thresholds keeps the freed blocks in the heap for the next
// step: the process's resident size stays at its peak instead of breathing,
// which is what PyTorch's GPU caching allocator does on purpose and what CPU
// users get from jemalloc or tcmalloc by LD_PRELOAD (torch's own tuning
// guides recommend them). glibc reads the same settings from
// MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ and MALLOC_TOP_PAD_ at start;
// a user who set any of them chose, and mallopt here would overwrite it.
HostMemoryPolicy keep_freed_host_memory() {
  HostMemoryPolicy policy;
#if defined(__GLIBC__)
  for (const char* tunable : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
    const char* value = std::getenv(tunable);
    if (value != nullptr && *value != '\0') {
      policy.reason = std::string(tunable) + " is set: glibc's malloc keeps the user's tuning";
      return policy;
    }
  }
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kKeptMmapThresholdBytes)) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kKeptTrimThresholdBytes)) == 1;
  policy.applied = mmap_set && trim_set;
  if (!policy.applied) policy.reason = "glibc's mallopt refused the thresholds";
#else
  policy.reason = "the C library is not glibc";
#endif
  return policy;
}

}  // namespace lockstep
