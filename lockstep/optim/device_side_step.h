// DeviceSideStep: an optimizer step that reads nothing from the host, as
// PyTorch's `capturable=True` optimizers take, so that a CUDA graph can hold
// it and replay it (engine/cuda_graph_step.h) and an eager step costs no host
// synchronisation.
//
// What a plain step reads from the host, this one keeps on the parameters'
// device (Note [What a captured optimizer step reads]):
//   - each parameter's step count: a float32 tensor, as PyTorch's capturable
//     Adam keeps it;
//   - each group's learning rate: a 0-dim float64 tensor, written from the
//     group's options by stage_host_values() before every step or replay
//     (the schedulers keep changing the options on the host);
//   - whether to skip the step: GradScaler's found-inf flag, passed to
//     step_on_device(), leaves every parameter and every state tensor
//     bitwise as it was, where a plain step is skipped by a host read.
//
// lockstep's Adam, AdamW (optim/adam.h) and SGD (optim/sgd.h) have it; the
// YAML key `capturable: true` turns it on, and `cuda_graph` does for the
// optimizer it captures. Anyone asks through the capability:
//
//   if (lockstep::DeviceSideStep* device = lockstep::device_side_step(optimizer)) {
//     device->set_capturable(true);
//     device->stage_host_values();           // outside any capture: lr into its tensors
//     device->step_on_device(found_inf);     // or torch::Tensor() for no skip
//     device->sync_host_state();             // before a checkpoint reads the state
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "lockstep/optim/foreach_choice.h"

namespace lockstep {

class DeviceSideStep {
 public:
  virtual ~DeviceSideStep() = default;

  // Whether step() takes the device-side form (`capturable`).
  virtual bool capturable() const = 0;
  virtual void set_capturable(bool capturable) = 0;

  // Writes what the step reads from the param groups' options (lr) into the
  // device tensors the step reads, before each step or replay. Inside a
  // capture it writes nothing (the write would be recorded with the value of
  // the moment): whoever replays stages before each replay.
  virtual void stage_host_values() = 0;

  // One step of every parameter that has a gradient, issuing device work
  // only: no host read, no host-dependent branch once every state exists.
  // `found_inf`, when defined, is a one-element float tensor on the
  // parameters' device; where it is nonzero the step leaves every parameter
  // and state tensor bitwise as it was (a GradScaler's skipped step).
  virtual void step_on_device(const torch::Tensor& found_inf) = 0;

  // The option values the step passes its kernels as numbers (everything
  // but the learning rate: betas, eps, weight decay, momentum, ...), of every
  // group in order. A captured step keeps the values of its capture; its
  // owner compares these before each replay, so that a scheduler changing
  // momentum or weight decay is an error rather than silently ignored.
  virtual std::vector<double> baked_options() const = 0;

  // Copies what lives only on the device (step counts, which momentum
  // buffers exist) into the optimizer's host state, which checkpoints save.
  // Costs one host read; const because it only refreshes that copy.
  virtual void sync_host_state() const = 0;
};

// The optimizer's device-side step, or null if it has none.
DeviceSideStep* device_side_step(torch::optim::Optimizer& optimizer);
const DeviceSideStep* device_side_step(const torch::optim::Optimizer& optimizer);

namespace detail {

// The device-side values one optimizer keeps for DeviceSideStep: each
// group's lr tensor and each parameter's step-count tensor. A step-count
// tensor is made from the host state's count and belongs to that state
// (`owner`, one of its tensors); when the host state is replaced (loaded
// from a checkpoint) the count is taken from the host again, so loading
// needs no hook.
class DeviceValues {
 public:
  // Writes every group's lr into its tensor (made on the group's first
  // parameter's device on first use).
  void stage(const torch::optim::Optimizer& optimizer);
  // Group `index`'s lr as a 0-dim float64 tensor (for what Python computes
  // from its float lr in double) and as a 0-dim float32 one (for where Python
  // multiplies a float32 tensor by it: two 0-dim tensors would promote to
  // float64, a Python float does not); stage() must have run.
  const torch::Tensor& lr(size_t index) const;
  const torch::Tensor& lr_float(size_t index) const;
  // The step count of `param`, whose host state `owner` holds `host_count`.
  torch::Tensor& step(const torch::Tensor& param, int64_t host_count, const torch::Tensor& owner);

 private:
  struct StepCount {
    torch::Tensor value;
    const void* owner = nullptr;
  };
  std::vector<torch::Tensor> lrs_;        // float64
  std::vector<torch::Tensor> lrs_float_;  // float32
  std::vector<std::pair<const void*, StepCount>> steps_;  // by parameter, in first-step order
};

}  // namespace detail

namespace detail {
// Fails when `foreach` is true: the device-side step is single-tensor only.
void check_single_tensor_for_capture(const std::optional<bool>& foreach);
// Whether a group of `params` steps by the foreach path: `chosen` where the
// user said (YAML `foreach`), else Python's default for this libtorch
// (Note [foreach as Python chooses it]).
bool steps_foreach(const std::optional<bool>& chosen, const std::vector<torch::Tensor>& params);
}  // namespace detail

// A libtorch optimizer class with the DeviceSideStep bookkeeping every
// capturable optimizer shares; the subclass writes step_on_device() and, in
// step(), calls run_step() with its plain step.
//
//   class Adam : public CapturableOptimizer<torch::optim::Adam> {
//     torch::Tensor step(LossClosure closure) override { return run_step(closure, [&] { plain_step(); }); }
//     void step_on_device(const torch::Tensor& found_inf) override;
//   };
// It also keeps the ForeachChoice (optim/foreach_choice.h): the subclass's
// plain step asks steps_foreach(group's parameters) which path to take.
template <typename TorchOptimizer>
class CapturableOptimizer : public TorchOptimizer, public DeviceSideStep, public ForeachChoice {
 public:
  using TorchOptimizer::TorchOptimizer;
  bool capturable() const override { return capturable_; }
  void set_capturable(bool capturable) override {
    if (capturable) detail::check_single_tensor_for_capture(foreach_);
    capturable_ = capturable;
  }
  void stage_host_values() override { device_values_.stage(*this); }
  void set_foreach(std::optional<bool> foreach) override {
    if (capturable_) detail::check_single_tensor_for_capture(foreach);
    foreach_ = foreach;
  }
  std::optional<bool> foreach() const override { return foreach_; }

 protected:
  // The closure's loss (if any) after the device-side step when capturable,
  // else after `plain_step`.
  torch::Tensor run_step(const typename TorchOptimizer::LossClosure& closure, const std::function<void()>& plain_step) {
    torch::Tensor loss;
    if (closure) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    if (capturable_) {
      stage_host_values();
      step_on_device(torch::Tensor());
    } else {
      plain_step();
    }
    return loss;
  }

  // Whether the plain step of a group of `params` takes the foreach path.
  bool steps_foreach(const std::vector<torch::Tensor>& params) const {
    return detail::steps_foreach(foreach_, params);
  }

  bool capturable_ = false;
  std::optional<bool> foreach_;
  // mutable: sync_host_state() is const and makes a count it has not seen.
  mutable detail::DeviceValues device_values_;
};

namespace detail {

// Fails when the current stream is being captured: optimizer state made (or
// a count refilled) inside a CUDA graph would be made again by every replay.
// `what` names the state for the message.
void check_not_capturing(const char* what);

// Runs `step`, then puts back every tensor of `guarded` where `found_inf`
// (undefined: no skip) is nonzero, bitwise (torch::where of copies taken
// before). The tensors must be updated in place by `step`.
void step_unless_found_inf(const std::vector<torch::Tensor>& guarded, const torch::Tensor& found_inf,
                           const std::function<void()>& step);

}  // namespace detail
}  // namespace lockstep
