// GradScaler: loss scaling for float16 training, as torch.amp.GradScaler.
//
// float16 gradients underflow to zero below ~6e-8. The scaler multiplies the
// loss by a large factor before backward, divides the gradients by it before
// the optimizer sees them, and skips any step whose gradients hold an inf or
// NaN (the factor was too large). Dynamic scaling starts at 2^16, halves on
// every such overflow and doubles after `growth_interval` clean steps in a
// row; a static scale keeps its value (overflowing steps are still skipped).
//
//   lockstep::GradScaler scaler;                        // dynamic, 2^16
//   scaler.scale(loss).backward();
//   scaler.unscale_(*optimizer);                        // optional: before clipping
//   torch::nn::utils::clip_grad_norm_(params, 1.0);
//   scaler.step(*optimizer);                            // skipped on inf/NaN
//   scaler.update();
//
// Under DDP or FSDP pass the model's GradientSync to unscale_/step: the
// found-inf flag is then agreed across ranks (GradientSync::any_rank_true), so
// every rank skips the same steps and keeps the same scale. AmpOptimWrapper
// (amp/amp_optim_wrapper.h) does all of this for a model's train_step.
//
// The fused kernels (compat/amp_ops.h) run where libtorch has them; the
// scale and growth tracker live on the device of the first scaled loss.
#pragma once

#include <cstdint>
#include <map>

#include <torch/torch.h>

#include "lockstep/core/state.h"

namespace lockstep {

class Config;
class GradientSync;

struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
  // false: a static scale of init_scale.
  TORCH_ARG(bool, dynamic) = true;
  // false: every call passes through (scale 1, no checks, step always taken).
  TORCH_ARG(bool, enabled) = true;
};

// Reads a `loss_scale` config value: "dynamic", a number (static scale), or a
// map {init_scale, growth_factor, backoff_factor, growth_interval} (dynamic).
GradScalerOptions parse_loss_scale(const Config& config);

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = GradScalerOptions());

  // loss * scale, in float32 (and the loss's shape).
  torch::Tensor scale(const torch::Tensor& loss);
  // Divides the gradients of `optimizer`'s parameters by the scale in place
  // and records whether any was inf/NaN (on any rank, with `sync`). Once per
  // optimizer between update()s; step() calls it if it was not called.
  void unscale_(torch::optim::Optimizer& optimizer, GradientSync* sync = nullptr);
  // Steps `optimizer` unless its gradients held an inf/NaN; returns whether it
  // stepped. A capturable optimizer (optim/device_side_step.h) is given the
  // found-inf flag and skips on the device, with no host read; step() then
  // returns true (found_inf() reads whether it skipped).
  bool step(torch::optim::Optimizer& optimizer, GradientSync* sync = nullptr);
  // Adjusts the scale from this iteration's steps (dynamic only) and readies
  // the scaler for the next iteration.
  void update();

  // The current scale (1 when disabled); reads it on the host.
  double get_scale() const;
  // The scale itself: float32 [1] on the loss's device (undefined when disabled).
  const torch::Tensor& scale_tensor() const { return scale_; }
  int64_t growth_tracker() const;
  // Whether the last unscale_ of `optimizer` found an inf/NaN (agreed across ranks).
  bool found_inf(const torch::optim::Optimizer& optimizer) const;
  // Whether `optimizer`'s gradients were unscaled since the last update() and it has not stepped yet.
  bool unscaled(const torch::optim::Optimizer& optimizer) const;
  // Each optimizer's stage between two update()s: ready, unscaled (unscale_(),
  // or step() unscaling first), stepped. update() forgets every optimizer, so
  // the next iteration finds each ready again.
  enum class Stage { kReady, kUnscaled, kStepped };
  bool is_enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }

  // {scale, growth_tracker} plus the factors, for checkpoints. Loading takes
  // the tracker, and the scale when dynamic (a static scale stays as
  // configured); the factors stay as configured, so a resumed run can change them.
  State state() const;
  void load_state(const State& state);

 private:
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    torch::Tensor found_inf;  // float32 [1] on the scale's device, agreed across ranks
  };
  void move_to(const torch::Device& device);

  GradScalerOptions options_;
  torch::Tensor scale_;           // float32 [1]
  torch::Tensor growth_tracker_;  // int32 [1]
  std::map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace lockstep
