// process_memory: this process's resident memory now and at its peak.
//
//   lockstep::ProcessMemory memory = lockstep::process_memory();
//   double mib = memory.peak_rss_bytes / 1048576.0;   // VmHWM
//
// Read from /proc/self/status (VmRSS, VmHWM); -1 where that is unreadable.
#pragma once

#include <cstdint>

namespace lockstep {

struct ProcessMemory {
  int64_t rss_bytes = -1;       // VmRSS: resident now
  int64_t peak_rss_bytes = -1;  // VmHWM: the resident high-water mark
};

ProcessMemory process_memory();

}  // namespace lockstep
