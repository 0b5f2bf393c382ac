// ProfilerHook: libtorch's profiler over a range of iterations, one Chrome
// trace per rank.
//
// Records iterations [begin, end) and writes <work_dir>/profiler/trace_rank<R>.json,
// readable by chrome://tracing and Perfetto: every operator the training
// thread ran, inside lockstep's named ranges
//   lockstep::data                    waiting for the next batch
//   lockstep::forward                 preprocessing and the model's losses
//   lockstep::backward                the backward pass
//   lockstep::wait_for_communication  waiting for gradient reductions (DDP, FSDP)
//   lockstep::optimizer_step          unscaling, clipping and the update
// record_shapes adds operator input shapes, profile_memory allocations (as
// libtorch records them). A run that ends inside the range writes what it has.
//
//   custom_hooks:
//     - {type: ProfilerHook, begin: 10, end: 13, record_shapes: true}
#pragma once

#include <memory>
#include <string>

#include "lockstep/compat/profiler.h"
#include "lockstep/engine/hook.h"

namespace lockstep {

class ProfilerHook : public Hook {
 public:
  ProfilerHook(std::string output_path, int64_t begin, int64_t end, bool record_shapes = false,
               bool profile_memory = false);
  void before_step() override;
  void after_step() override;
  void after_train() override;
  const std::string& output_path() const { return output_path_; }

 private:
  void finish();
  std::string output_path_;
  int64_t begin_, end_;
  bool record_shapes_, profile_memory_;
  std::unique_ptr<compat::CpuProfiler> profiler_;
};

}  // namespace lockstep
