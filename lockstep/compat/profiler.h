// The profiler seam: libtorch's CPU profiler on the calling thread, written
// as a Chrome trace.
//
// Debian's libtorch (1.13 and 2.6) is built without Kineto, so the profiler
// that works there is the legacy one (torch/csrc/autograd/profiler_legacy.h):
// it records every operator and every RECORD_USER_SCOPE range run on the
// thread that started it (the training loop: forward, backward on CPU, the
// optimizer, the waits for communication). Version differences in its
// configuration live here.
//
//   lockstep::compat::CpuProfiler profiler(/*record_shapes=*/true, /*profile_memory=*/false);
//   ... iterations ...
//   profiler.stop_and_write("work_dirs/run/profiler/trace_rank0.json");   // chrome://tracing, Perfetto
#pragma once

#include <string>

#include <c10/macros/Macros.h>

namespace lockstep::compat {

class CpuProfiler {
 public:
  // Starts recording on this thread.
  CpuProfiler(bool record_shapes, bool profile_memory);
  // Stops a recording still running, discarding it.
  ~CpuProfiler();
  C10_DISABLE_COPY_AND_ASSIGN(CpuProfiler);

  // Stops recording and writes the events as a Chrome trace JSON file
  // (the parent folder must exist). On the thread that started it.
  void stop_and_write(const std::string& path);
  bool running() const { return running_; }

 private:
  bool running_ = false;
};

}  // namespace lockstep::compat
