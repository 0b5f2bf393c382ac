// AmpOptimWrapper: mixed-precision training as one switch of the optim
// wrapper, for every strategy (single device, DDP, separate DDP, FSDP).
//
// mmengine's AmpOptimWrapper semantics, built on OptimWrapper's seams: the
// forward pass of each micro-step runs under autocast (AutocastGuard), the
// loss is scaled before backward, the gradients are unscaled exactly once per
// update (before clipping, so clip_grad sees true norms), a step with inf/NaN
// gradients is skipped on every rank (through GradientSync::any_rank_true),
// and the scaler's state goes into the optimizer state of checkpoints. The
// scale used for each update is logged as "loss_scale" (detectron2's
// log_grad_scaler).
//
//   optim_wrapper:
//     type: AmpOptimWrapper
//     dtype: bf16                 # bf16 | fp16 (default: fp16 on cuda, bf16 on cpu)
//     loss_scale: dynamic         # dynamic | 512.0 | {init_scale: 65536, growth_interval: 2000, ...}
//     device: auto                # auto (the parameters' device) | cpu | cuda
//     optimizer: {type: SGD, lr: 0.05, momentum: 0.9}
//     clip_grad: {max_norm: 10}
//
// or, as a switch on any plain optim wrapper section (the same keys under `amp`):
//
//   optim_wrapper:
//     optimizer: {type: SGD, lr: 0.05, momentum: 0.9}
//     amp: {dtype: bf16, loss_scale: dynamic}     # or `amp: true` for the defaults
//
// Without loss_scale, fp16 uses dynamic scaling and bf16 runs without a
// scaler (bfloat16 has float32's range). Models need no change: their
// train_step already runs the forward pass inside optim_context().
//
//   auto optim = std::make_shared<lockstep::AmpOptimWrapper>(sgd, lockstep::OptimWrapperOptions(),
//       lockstep::AmpOptions().dtype(torch::kBFloat16));
//   model->train_step(batch, *optim);
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "lockstep/amp/grad_scaler.h"
#include "lockstep/optim/optim_wrapper.h"

namespace lockstep {

struct AmpOptions {
  // nullopt: float16 on CUDA, bfloat16 on CPU.
  TORCH_ARG(std::optional<torch::ScalarType>, dtype) = std::nullopt;
  // nullopt: dynamic scaling for float16, no scaler for bfloat16.
  TORCH_ARG(std::optional<GradScalerOptions>, loss_scale) = std::nullopt;
  // nullopt: the device of the optimizer's parameters.
  TORCH_ARG(std::optional<c10::DeviceType>, device) = std::nullopt;
};

// "bf16"/"bfloat16" or "fp16"/"float16"/"half" (the config's dtype values).
torch::ScalarType parse_amp_dtype(const std::string& text, const std::string& where = "");

class AmpOptimWrapper : public OptimWrapper {
 public:
  // Throws if autocast does not support the dtype on the device (fp16 on CPU).
  AmpOptimWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer, OptimWrapperOptions options = OptimWrapperOptions(),
                  AmpOptions amp = AmpOptions());
  ~AmpOptimWrapper() override;

  torch::ScalarType dtype() const { return dtype_; }
  c10::DeviceType device_type() const { return device_; }
  // Null when running without loss scaling (bf16 without loss_scale).
  GradScaler* grad_scaler() const { return scaler_.get(); }

  // The optim wrapper's state and the grad scaler's ("grad_scaler").
  State state() const override;
  void load_state(const State& state) override;

 protected:
  std::function<void()> enter_forward_context() override;
  torch::Tensor scale_for_backward(const torch::Tensor& loss) override;
  void unscale_gradients() override;
  bool optimizer_step() override;

 private:
  torch::ScalarType dtype_;
  c10::DeviceType device_;
  std::unique_ptr<GradScaler> scaler_;
};

}  // namespace lockstep
