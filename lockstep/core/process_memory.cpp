#include "lockstep/core/process_memory.h"

#include <fstream>
#include <string>

namespace lockstep {

ProcessMemory process_memory() {
  ProcessMemory memory;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) memory.rss_bytes = std::stoll(line.substr(6)) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) memory.peak_rss_bytes = std::stoll(line.substr(6)) * 1024;
  }
  return memory;
}

}  // namespace lockstep
