// SyncBuffersHook: makes every rank's buffers (BatchNorm statistics) equal
// before each validation and test pass.
//
// With DDP each rank updates its buffers from its own batches (unless
// broadcast_buffers or SyncBatchNorm keep them equal), so ranks would
// evaluate different models. mode `mean` averages floating-point buffers
// over the ranks (mmengine's SyncBuffersHook); `broadcast` copies rank 0's
// (torch DDP's broadcast_buffers). Integer buffers (num_batches_tracked) are
// always broadcast. On one process it does nothing.
//
//   custom_hooks:
//     - {type: SyncBuffersHook, mode: mean}
#pragma once

#include <functional>

#include <torch/types.h>

#include "lockstep/engine/hook.h"

namespace lockstep {

class SyncBuffersHook : public Hook {
 public:
  // `average` all-reduces a tensor to its mean over ranks in place;
  // `broadcast` copies rank 0's into it. Null: one process, nothing to do.
  SyncBuffersHook(bool mean, std::function<void(torch::Tensor&)> average,
                  std::function<void(torch::Tensor&)> broadcast);
  void before_val_epoch() override { sync(); }
  void before_test_epoch() override { sync(); }
  void sync();

 private:
  bool mean_;
  std::function<void(torch::Tensor&)> average_, broadcast_;
};

}  // namespace lockstep
