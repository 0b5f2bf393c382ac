#include "lockstep/model/memory_format.h"

#include "lockstep/core/error.h"

namespace lockstep {

c10::MemoryFormat parse_memory_format(const std::string& name, const std::string& where) {
  if (name == "contiguous_format") return c10::MemoryFormat::Contiguous;
  if (name == "channels_last") return c10::MemoryFormat::ChannelsLast;
  if (name == "channels_last_3d") return c10::MemoryFormat::ChannelsLast3d;
  LOCKSTEP_FAIL(where, ": memory_format must be contiguous_format, channels_last or channels_last_3d, got '", name,
                "'");
}

bool memory_format_applies(const torch::Tensor& tensor, c10::MemoryFormat format) {
  if (!tensor.defined()) return false;
  switch (format) {
    case c10::MemoryFormat::ChannelsLast:
      return tensor.dim() == 4;
    case c10::MemoryFormat::ChannelsLast3d:
      return tensor.dim() == 5;
    case c10::MemoryFormat::Contiguous:
      return tensor.dim() == 4 || tensor.dim() == 5;
    default:
      return false;
  }
}

// Note [Which layout a tensor is in]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A tensor with one channel (the first convolution's weight on grey images,
// [32, 1, 3, 3]) is contiguous in both formats at once, so
// contiguous(channels_last) leaves it as it is; but its strides still
// suggest NCHW, and oneDNN runs a convolution channels-last only when its
// input's or its weight's suggest_memory_format() says so. Left alone, the
// first layer ran NCHW and every step reordered between the two: slower
// than no conversion at all. PyTorch's Tensor.to(memory_format=) copies
// whenever the suggested format differs, which Module.to uses; so does this.
torch::Tensor in_memory_format(const torch::Tensor& tensor, c10::MemoryFormat format) {
  if (tensor.suggest_memory_format() == format) return tensor;
  return tensor.to(tensor.options(), /*non_blocking=*/false, /*copy=*/false, format);
}

void rewrite(torch::Tensor& tensor, c10::MemoryFormat format) {
  if (!memory_format_applies(tensor, format) || tensor.suggest_memory_format() == format) return;
  torch::NoGradGuard no_grad;
  tensor.set_data(in_memory_format(tensor.detach(), format));
}

void to_memory_format(torch::nn::Module& module, c10::MemoryFormat format) {
  for (auto& parameter : module.parameters(/*recurse=*/true)) {
    rewrite(parameter, format);
    const torch::Tensor& grad = parameter.grad();
    if (memory_format_applies(grad, format)) parameter.mutable_grad() = in_memory_format(grad, format);
  }
  for (auto& buffer : module.buffers(/*recurse=*/true)) rewrite(buffer, format);
}

}  // namespace lockstep
