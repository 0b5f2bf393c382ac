// Memory formats: PyTorch's `model.to(memory_format=torch.channels_last)` for
// a lockstep model, chosen in its config.
//
// On the CPU, oneDNN runs a channels-last convolution without reordering its
// input and weight each call (20% faster steps for the Fashion-MNIST CNN,
// BENCHMARKS.md); on GPUs, cuDNN's NHWC kernels use tensor cores. The values
// do not change, only their order in memory: DDP's buckets keep each
// parameter's strides, FSDP flattens in logical order (as PyTorch's FSDP
// does, its views are then contiguous), checkpoints store logical order.
//
//   model:
//     type: ConvNet
//     memory_format: channels_last   # contiguous_format (default), channels_last, channels_last_3d
//
//   to_memory_format(*model, c10::MemoryFormat::ChannelsLast);   // parameters and buffers
//   model->data_preprocessor().set_input_memory_format(c10::MemoryFormat::ChannelsLast);   // inputs
#pragma once

#include <string>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace lockstep {

// "contiguous_format", "channels_last" or "channels_last_3d" (PyTorch's
// names); anything else fails naming `where` and the three.
c10::MemoryFormat parse_memory_format(const std::string& name, const std::string& where);

// Whether `format` reorders `tensor`: channels_last applies to rank-4
// tensors, channels_last_3d to rank-5 ones, as in PyTorch's Module.to.
bool memory_format_applies(const torch::Tensor& tensor, c10::MemoryFormat format);

// `tensor` in `format`, as PyTorch's Tensor.to(memory_format=) gives it: itself
// when its strides already suggest `format`, else a copy (Note [Which layout
// a tensor is in], memory_format.cpp).
torch::Tensor in_memory_format(const torch::Tensor& tensor, c10::MemoryFormat format);

// Every parameter and buffer of `module` (and its submodules) that `format`
// applies to is rewritten in it, in place (the same tensors, so optimizers,
// hooks and a TorchScript module that share them follow). Gradients that
// exist are converted too.
void to_memory_format(torch::nn::Module& module, c10::MemoryFormat format);

}  // namespace lockstep
