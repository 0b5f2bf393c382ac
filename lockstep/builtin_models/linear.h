// lockstep::Linear: torch::nn::Linear whose forward is Python's nn.Linear
// (torch::linear, one op), so that under autocast its gradients become ready
// in the order PyTorch's Python modules give them (Note [Linear as Python's
// nn.Linear]). The built-in classifiers and the examples use it; it is a
// torch::nn::LinearImpl, so `module->as<torch::nn::Linear>()` still finds it.
//
//   auto head = lockstep::Linear(torch::nn::LinearOptions(128, 10));
//   torch::Tensor logits = head(features);        // torch::linear(features, weight, bias)
//   auto copy = head->clone();                    // a lockstep::LinearImpl, same values
#pragma once

#include <memory>

#include <torch/torch.h>

namespace lockstep {

class LinearImpl : public torch::nn::LinearImpl {
 public:
  using torch::nn::LinearImpl::LinearImpl;

  torch::Tensor forward(const torch::Tensor& input);

  // A copy of this layer, not of its base: torch's Cloneable would slice it
  // back into a torch::nn::LinearImpl, whose forward is C++'s.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;

  void pretty_print(std::ostream& stream) const override;
};

TORCH_MODULE(Linear);

}  // namespace lockstep
