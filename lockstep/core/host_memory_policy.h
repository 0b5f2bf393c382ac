// host_memory_policy: keep the memory a training step frees for the next step,
// instead of giving it back to the kernel and faulting it in again.
//
//   lockstep::HostMemoryPolicy policy = lockstep::keep_freed_host_memory();
//   if (!policy.applied) LOG(INFO) << policy.reason;   // e.g. MALLOC_TRIM_THRESHOLD_ is set
//
// The Runner calls it once, before the model is built, unless the config says
// `env: {keep_freed_host_memory: false}`. It is process-wide and cannot be
// undone (glibc's mallopt). Note [Freed activations stay in the process].
#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

struct HostMemoryPolicy {
  bool applied = false;
  std::string reason;  // why not, when not applied
};

// Blocks below this come from the heap, not from a mapping of their own.
constexpr int64_t kKeptMmapThresholdBytes = int64_t{64} << 20;
// Free memory at the top of the heap is returned only above this.
constexpr int64_t kKeptTrimThresholdBytes = int64_t{512} << 20;

// Raises glibc's mmap and trim thresholds to the two values above. Does nothing
// (and says why) where the C library is not glibc, or where the user has set
// one of glibc's own MALLOC_*_ tunables: theirs win.
HostMemoryPolicy keep_freed_host_memory();

}  // namespace lockstep
