// SyncBatchNorm: batch normalisation whose batch is the union of the local
// batches of a process group, so that data-parallel training with small
// per-rank batches normalises (and back-propagates) exactly as one process
// with the whole batch would. The state (weight, bias, running_mean,
// running_var, num_batches_tracked) has the names of torch::nn::BatchNorm*d,
// so state dicts and checkpoints interchange.
//
//   lockstep::init_from_env();
//   auto net = torch::nn::Sequential(torch::nn::Conv2d(3, 16, 3), torch::nn::BatchNorm2d(16),
//                                    torch::nn::ReLU());
//   auto synced = lockstep::convert_sync_batchnorm(net);   // in place: net now holds SyncBatchNorms
//   auto bn = lockstep::SyncBatchNorm(lockstep::SyncBatchNormOptions(16).momentum(0.01));
//
// Semantics (PyTorch's torch.nn.SyncBatchNorm):
//   - Training: mean and biased variance over all ranks' elements of each
//     channel, each rank weighted by its element count (a rank may hold an
//     empty batch); running stats follow BatchNorm's update with the unbiased
//     global variance (momentum nullopt = cumulative average). Backward reduces
//     the per-channel sums of dy and dy*(x-mean) over ranks for grad_input;
//     grad_weight / grad_bias are this rank's contributions (DDP averages them).
//   - Eval mode never communicates: running stats, or this rank's own batch
//     statistics when track_running_stats is off (ranks may evaluate alone).
//   - A group of one, or no process group initialised and none given: exactly
//     torch::nn::BatchNorm*d, without communication.
// Every rank of the group calls forward (in training) and backward in the same
// order; a rank whose batch is empty still calls both.
// Kernels: CUDA inputs take PyTorch's own path, libtorch's fused kernels
// (batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_elemt,
// batch_norm_backward_reduce, batch_norm_backward_elemt), which exist for CUDA
// only; CPU inputs combine per-rank (count, mean, M2) in float64 with tensor ops.
#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <ostream>

#include "lockstep/comm/process_group.h"

namespace lockstep {

struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(int64_t num_features);
  // The options of a torch::nn::BatchNorm{1,2,3}d, synchronised over `group`.
  SyncBatchNormOptions(const torch::nn::BatchNormOptions& options,
                       std::shared_ptr<ProcessGroup> group = nullptr);

  TORCH_ARG(int64_t, num_features);
  TORCH_ARG(double, eps) = 1e-5;
  TORCH_ARG(c10::optional<double>, momentum) = 0.1;
  TORCH_ARG(bool, affine) = true;
  TORCH_ARG(bool, track_running_stats) = true;
  // The ranks whose batches form one batch: a group every rank holding this
  // module belongs to. Null: lockstep::world() as it is at forward time.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group);
};

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(SyncBatchNormOptions options);
  // Takes over a torch::nn::BatchNorm{1,2,3}d's parameters and buffers (the
  // same tensors, so an optimizer built on them keeps working), their
  // requires_grad, and its training flag.
  SyncBatchNormImpl(SyncBatchNormOptions options, const torch::nn::Module& batch_norm);

  // input: [N, C, *] with C = num_features (N may be 0 on some ranks).
  torch::Tensor forward(const torch::Tensor& input);

  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  // The group a training forward reduces over: the configured one, else the
  // world when initialised, else nullptr (this process alone).
  std::shared_ptr<ProcessGroup> process_group() const;

  SyncBatchNormOptions options;
  // As in torch::nn::BatchNorm*d: undefined when affine / track_running_stats is off.
  torch::Tensor weight;
  torch::Tensor bias;
  torch::Tensor running_mean;
  torch::Tensor running_var;
  torch::Tensor num_batches_tracked;

 private:
  void register_state(torch::Tensor weight, torch::Tensor bias, torch::Tensor running_mean,
                      torch::Tensor running_var, torch::Tensor num_batches_tracked);
  torch::Tensor synced_forward(const torch::Tensor& input, ProcessGroup& group, double average_factor);
  // CUDA inputs: PyTorch's SyncBatchNorm on libtorch's fused kernels.
  torch::Tensor fused_synced_forward(const torch::Tensor& input, ProcessGroup& group, double average_factor);
};

TORCH_MODULE(SyncBatchNorm);

// Replaces every torch::nn::BatchNorm{1,2,3}d in `module`'s tree by a
// SyncBatchNorm over `group` (null: the world at forward time) that takes over
// its options, parameters, buffers, requires_grad and training flag. Children
// of Sequential, ModuleList and ModuleDict are replaced inside the container
// too, so their forward calls the new module; a BatchNorm registered twice
// becomes one SyncBatchNorm. Returns `module`, or the new module when
// `module` is itself a BatchNorm.
//
// A BatchNorm that something else still references after the replacement (a
// `torch::nn::BatchNorm2d bn` member that a custom forward calls, or a handle
// the caller kept) is an error naming its path: that forward would keep
// calling the unsynchronised module. Declare such members as SyncBatchNorm,
// build them inside a Sequential, or drop the extra handles before
// converting. The tree is converted wherever possible before the error.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          std::shared_ptr<ProcessGroup> group = nullptr);

template <typename ModuleType>
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(const torch::nn::ModuleHolder<ModuleType>& module,
                                                          std::shared_ptr<ProcessGroup> group = nullptr) {
  return convert_sync_batchnorm(std::static_pointer_cast<torch::nn::Module>(module.ptr()), std::move(group));
}

}  // namespace lockstep
