#include "lockstep/builtin_models/linear.h"

namespace lockstep {

// Note [Linear as Python's nn.Linear]
// Python's nn.Linear calls F.linear, which is at::linear: one op, which
// autocast casts as a whole (its arguments in the order input, weight, bias),
// and which decomposes into the same kernels as libtorch's C++ Linear in
// float32 (addmm for a 2-D input with a bias). libtorch's C++
// torch::nn::Linear instead calls torch::nn::functional::linear, which
// builds addmm(bias, input, weight.t()) itself: under autocast each of those
// is cast on its own, bias first. The numbers of a step are the same either
// way, but the autograd graph is not: under CPU bf16 autocast Python's
// gradients become ready weight before bias, C++'s bias before weight
// (measured on libtorch 1.13: head.3.weight, head.3.bias, head.1.weight, ...
// against head.3.bias, head.3.weight, ...; a TorchScript module follows
// C++). DDP rebuilds its buckets in ready order (Note [Bucket order and
// rebuild]), and with 3 or more ranks where a bucket's elements fall decides
// where each of Gloo's ring sums starts: the ConvNet under bf16 at 3 ranks
// ended one ulp away from PyTorch's and mmengine's DDP (issue 59). Float32
// has no cast nodes and 2 ranks add in any order alike, so only that corner
// moved. lockstep::Linear forwards through torch::linear, Python's path, in
// every version (for a contiguous 3-D input at::linear also fuses the bias
// into addmm as Python does). The GPT example keeps torch::nn::Linear: its
// 3-D activations would round differently from its recorded results.
torch::Tensor LinearImpl::forward(const torch::Tensor& input) { return torch::linear(input, weight, bias); }

std::shared_ptr<torch::nn::Module> LinearImpl::clone(const c10::optional<torch::Device>& device) const {
  auto copy = std::make_shared<LinearImpl>(options);
  torch::NoGradGuard no_grad;
  auto copied = copy->named_parameters(/*recurse=*/false);
  for (const auto& item : named_parameters(/*recurse=*/false)) {
    const torch::Tensor& source = item.value();
    copied[item.key()].set_data(device && source.device() != *device ? source.to(*device) : source.clone());
  }
  copy->train(is_training());
  return copy;
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "lockstep::Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << options.bias() << ")";
}

}  // namespace lockstep
