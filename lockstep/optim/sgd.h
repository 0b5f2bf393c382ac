// SGD: libtorch's torch::optim::SGD (the same options, state and checkpoint
// format) stepping as Python's SGD does: one tensor at a time
// (_single_tensor_sgd, what libtorch's own step does) or all of a group at
// once (_multi_tensor_sgd: `foreach`, optim/foreach_choice.h, the default on
// a GPU from PyTorch 2.0 on; a group with a sparse gradient steps one tensor
// at a time), and with the device-side step of optim/device_side_step.h.
//
// With set_capturable(true) (YAML `capturable: true`; PyTorch's SGD has no
// such key, because its only host number is the learning rate) the learning
// rate lives on the parameters' device and whether a momentum buffer exists
// is a device flag, so the step reads nothing from the host and a CUDA graph
// can hold it. It takes dampening 0 only. It computes what the plain step
// does, with the learning rate multiplied in from a tensor (addcmul) instead
// of passed as a scalar (add's alpha), which may round differently.
//
//   auto sgd = std::make_shared<lockstep::SGD>(model->parameters(),
//                                              torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
//   sgd->set_capturable(true);
//   loss.backward();
//   sgd->step();
//
// The YAML type `SGD` builds it.
#pragma once

#include <utility>
#include <vector>

#include <torch/optim/sgd.h>

#include "lockstep/optim/device_side_step.h"

namespace lockstep {

class SGD : public CapturableOptimizer<torch::optim::SGD> {
 public:
  using CapturableOptimizer<torch::optim::SGD>::CapturableOptimizer;
  torch::Tensor step(LossClosure closure = nullptr) override;
  // Throws for a param group with momentum and a nonzero dampening.
  void set_capturable(bool capturable) override;
  void step_on_device(const torch::Tensor& found_inf) override;
  void sync_host_state() const override;
  std::vector<double> baked_options() const override;

 private:
  std::vector<torch::Tensor> params_with_grad(size_t index) const;
  // One group's plain step, one tensor at a time or by foreach (Note
  // [foreach as Python chooses it]).
  void single_tensor_step(size_t index);
  void foreach_step(size_t index);

  // Whether a parameter's momentum buffer holds a first step, on the device
  // (Note [SGD's momentum buffer on the device]), with the host buffer it
  // belongs to: a buffer loaded from a checkpoint replaces that one.
  struct MadeFlag {
    const void* buffer = nullptr;
    torch::Tensor made;
  };
  torch::Tensor& made_flag(const torch::Tensor& param, const torch::Tensor& buffer, bool made_on_host);

  std::vector<std::pair<const void*, MadeFlag>> made_;
};

}  // namespace lockstep
