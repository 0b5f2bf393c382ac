// Adam and AdamW that take the same steps as Python's torch.optim.Adam and
// torch.optim.AdamW of the PyTorch version lockstep is built against.
//
// libtorch's C++ torch::optim::Adam and AdamW follow PyTorch 1.x's Python
// optimizers; from PyTorch 2.0 on, Python computes the first moment and one
// bias correction with other operations (Note [Adam as Python computes it]),
// so a C++ run and a Python run of the same model drift apart in the last
// bits, step after step. These classes are libtorch's (same
// options, same per-parameter state, so checkpoints, schedulers and
// `dynamic_cast<torch::optim::Adam*>` see no difference) with step() doing
// what Python's single-tensor path does, operation for operation. That path
// is Python's default on CPU (foreach and fused are for GPUs).
//
// The YAML types `Adam` and `AdamW` build these.
//
//   auto optimizer = std::make_shared<lockstep::Adam>(model->parameters(),
//                                                     torch::optim::AdamOptions(1e-3).weight_decay(1e-4));
//   loss.backward();
//   optimizer->step();
//
// Python keeps the step count in a float32 tensor, which stops counting at
// 2^24 = 16,777,216 steps; these keep an int64 and go on. The two agree up to
// that step.
//
// With set_capturable(true) (YAML `capturable: true`, PyTorch's key) step()
// is Python's capturable single-tensor path instead: the step count and the
// learning rate live on the parameters' device and nothing is read from the
// host, so a CUDA graph can hold the step (optim/device_side_step.h).
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <vector>

#include "lockstep/optim/device_side_step.h"

namespace lockstep {

// libtorch's `Base` (torch::optim::Adam or AdamW, with its `Options` and
// `ParamState`) stepping as Python does; AdamW decays the weights decoupled
// from the gradient. Adam and AdamW below are its two instances.
template <typename Base, typename Options, typename ParamState, bool kDecoupledDecay>
class PythonAdam : public CapturableOptimizer<Base> {
 public:
  using CapturableOptimizer<Base>::CapturableOptimizer;
  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override;
  void step_on_device(const torch::Tensor& found_inf) override;
  void sync_host_state() const override;
  std::vector<double> baked_options() const override;
};

extern template class PythonAdam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, false>;
extern template class PythonAdam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState,
                                 true>;

class Adam : public PythonAdam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, false> {
 public:
  using PythonAdam::PythonAdam;
};

class AdamW
    : public PythonAdam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState, true> {
 public:
  using PythonAdam::PythonAdam;
};

}  // namespace lockstep
