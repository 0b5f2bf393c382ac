#include "lockstep/compat/profiler.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <fstream>
#include <vector>

#include "lockstep/core/error.h"

namespace lockstep::compat {

namespace legacy = torch::autograd::profiler;

CpuProfiler::CpuProfiler(bool record_shapes, bool profile_memory) {
  legacy::enableProfilerLegacy(
      torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU, record_shapes, profile_memory));
  running_ = true;
}

CpuProfiler::~CpuProfiler() {
  if (!running_) return;
  try {
    (void)legacy::disableProfilerLegacy();
  } catch (...) {
  }
}

void CpuProfiler::stop_and_write(const std::string& path) {
  LOCKSTEP_CHECK(running_, "profiler: stop_and_write called twice");
  running_ = false;
  legacy::thread_event_lists lists = legacy::disableProfilerLegacy();
  std::vector<legacy::LegacyEvent*> events;
  for (auto& list : lists) {
    for (auto& event : list) events.push_back(&event);
  }
  std::ofstream out(path);
  LOCKSTEP_CHECK(out.good(), "profiler: cannot write ", path);
  legacy::writeProfilerEventsToStream(out, events);
  out.close();
  LOCKSTEP_CHECK(out.good(), "profiler: writing ", path, " failed");
}

}  // namespace lockstep::compat
