// CudaGraphStep: the whole training step as one CUDA graph (the YAML key
// `cuda_graph: {warmup_iters: N}`; Note [The whole step as one CUDA graph]).
//
// A small model's step on a fast GPU is a few hundred tiny kernel launches,
// and the host, not the GPU, sets its pace. Captured once and replayed, the
// step costs one launch. The trainer (engine/trainer.h) runs each iteration
// through run() when its options hold a CudaGraphOptions:
//
//   - the first warmup_iters steps run eagerly, on a side stream;
//   - the next step of each kind (its batch's shapes and dtypes, whether it
//     updates, the accumulation divisor, whether gradients exist) is
//     captured: forward, loss, backward, gradient clipping, the loss
//     scaler's unscale, found-inf and update, and the optimizer step;
//   - every later step of that kind copies its batch into the captured
//     inputs, writes the learning rates into their device tensors, and
//     replays. A batch of another shape (the last, partial one) is captured
//     once more, into its own graph.
//
//   lockstep::CudaGraphStep graphed(lockstep::CudaGraphOptions().warmup_iters(3));
//   auto outputs = graphed.run(model, optim_wrapper, batch, step);
//   lockstep::LogVars log_vars = outputs.returned;
//   for (const auto& [name, value] : lockstep::scalars_to_host(outputs.logged)) log_vars[name] = value;
//
// What a capture needs is checked before training (cuda_graph_obstacle):
// one optimizer with a device-side step (SGD, Adam, AdamW: optim/device_side_step.h),
// set capturable for the whole run so that warm-up and replay compute alike.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/types.h>

#include "lockstep/model/model.h"
#include "lockstep/optim/optim_wrapper.h"

namespace lockstep {

struct CudaGraphOptions {
  // Eager steps before the first capture (lazily made kernels' handles,
  // workspaces and optimizer states must exist before it).
  TORCH_ARG(int64_t, warmup_iters) = 3;
};

// Reads a `cuda_graph` config section ({warmup_iters: N}); unknown keys and a
// warmup_iters below 1 are errors naming the key.
CudaGraphOptions parse_cuda_graph_options(const Config& section);

// Why this optim wrapper's steps cannot be captured, or "" if they can: it
// holds several optimizers, or its optimizer (`optimizer_type`, for the
// message) has no device-side step. When it can, turns the optimizer's
// device-side step on (set_capturable), whose own refusal (SGD's dampening)
// comes back as the reason.
std::string prepare_optimizer_for_cuda_graph(OptimWrapperBase& optim_wrapper, const std::string& optimizer_type);

class CudaGraphStep {
 public:
  explicit CudaGraphStep(CudaGraphOptions options);
  ~CudaGraphStep();
  C10_DISABLE_COPY_AND_ASSIGN(CudaGraphStep);

  // What one step gives back: what the model's train_step returned (numbers
  // it read itself), and the values it logged, still on the device (Note
  // [Logged values read after the step]; a replay rewrites them, so read
  // them before the next step).
  struct Outputs {
    LogVars returned;
    std::map<std::string, torch::Tensor> logged;
  };
  // One training step of `model` on `batch` with `optim_wrapper` (an
  // OptimWrapper whose optimizer is capturable), as Model::run_train_step
  // does it.
  Outputs run(Model& model, OptimWrapperBase& optim_wrapper, const Batch& batch, const StepContext& step);

  const CudaGraphOptions& options() const { return options_; }
  // Graphs captured so far (one per kind of step).
  size_t graphs() const { return graphs_.size(); }
  int64_t eager_steps() const { return eager_steps_; }

  // The kind of step `batch` makes with `optim_wrapper` now: steps of one
  // kind replay one graph (shapes and dtypes of the batch, whether this
  // backward synchronises and steps, the loss divisor, whether gradients
  // exist before it).
  static std::string step_kind(const Batch& batch, OptimWrapper& optim_wrapper);

 private:
  struct Captured;
  // What the captured graphs' tensors belong to: the parameters' storage and
  // the optimizer state's generation. A change (weights or optimizer state
  // loaded) drops every graph.
  std::vector<const void*> fingerprint(OptimWrapper& optim_wrapper) const;
  Outputs run_eagerly(Model& model, OptimWrapperBase& optim_wrapper, const Batch& batch, const StepContext& step);
  Captured& capture(Model& model, OptimWrapper& optim_wrapper, const Batch& batch, const StepContext& step,
                    const std::string& kind);

  CudaGraphOptions options_;
  int64_t eager_steps_ = 0;
  std::map<std::string, std::unique_ptr<Captured>> graphs_;
  std::vector<const void*> captured_for_;
  int64_t captured_generation_ = -1;
};

}  // namespace lockstep
