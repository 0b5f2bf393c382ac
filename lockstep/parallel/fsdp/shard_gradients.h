// fsdp::ShardGradients: the gradient side of one FSDP unit (FlatParamUnit
// owns one). Autograd's gradients of the unit's parameters move into one
// padded flat buffer as they arrive (absorb), which is reduce-scattered over
// the shard group (or all-reduced over the replicas without sharding) into
// this rank's shard's .grad. Under use_orig_params, the views an optimizer
// steps instead of the shard (one per original parameter) see their parts of
// that gradient, and what the optimizer side did to theirs is taken back.
//
//   unit.gradients().absorb(slot);      // autograd accumulated slot's gradient
//   unit.gradients().start_reduce();    // the unit's backward is done
//   ...                                 // the next unit's backward runs
//   unit.gradients().finish_reduce();   // shard().grad() holds the average
//   unit.gradients().wait_for_host_copies();  // CPU offload: before the optimizer reads it
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/torch.h>

namespace lockstep {
class Work;
}  // namespace lockstep

namespace lockstep::fsdp {

class FlatParamUnit;

class ShardGradients {
 public:
  explicit ShardGradients(FlatParamUnit& unit) : unit_(unit) {}
  ~ShardGradients();  // waits for a reduction in flight
  C10_DISABLE_COPY_AND_ASSIGN(ShardGradients);

  // Moves slot `slot`'s gradient into the padded flat buffer of this unit's
  // next reduction (allocated, zeroed, on first use) and drops it from the
  // parameter, so a unit's gradients never exist twice while its backward runs.
  void absorb(size_t slot);
  // Absorbs the gradients still on the parameters (none: zeros) and starts
  // reducing the flat buffer into this rank's shard of the gradient
  // (reduce-scatter, or all-reduce without sharding).
  void start_reduce();
  bool reduce_pending() const;
  // Waits, averages across replicas (HYBRID_SHARD), adds into shard().grad().
  // With CPU offload from a GPU the gradient goes to pinned host memory
  // asynchronously: call wait_for_host_copies() before reading it.
  void finish_reduce();
  // Waits for that copy (synchronises the compute device).
  void wait_for_host_copies();
  // Bytes held by gradients: the parameters' own, the flat buffers in flight, the shard's.
  int64_t bytes() const;

  // use_orig_params (PyTorch's name): each slot's part of this rank's shard
  // becomes a leaf tensor of its own, flattened, empty where the slot lies
  // wholly in other ranks' shards, sharing the shard's memory. After every
  // reduction its .grad is the same part of the shard's .grad. An optimizer
  // over these steps the shard in place, with options per original parameter.
  // A view whose .grad was dropped (zero_grad with set_to_none) drops that
  // part of the shard's gradient, and a .grad assigned by hand is adopted.
  void expose_orig_params();
  // One per slot, in slot order; empty until expose_orig_params().
  const std::vector<torch::Tensor>& orig_params() const { return orig_params_; }
  // Makes what the optimizer side did to the views' gradients the shard's:
  // none kept (zero_grad) frees the shard's gradient; a view's dropped or
  // replaced gradient clears or fills its part. Called before each reduction
  // adds into the shard's gradient, and by FSDP before each forward (so a
  // gradient zero_grad dropped does not outlive the step).
  void collect_orig_grads();

 private:
  void accumulate_shard_grad(torch::Tensor result);
  // Per-parameter layout (Note [FSDP2's gradients]): the reduce-scatter input
  // of the parameters that have a gradient, into reduce_in_; its per-rank
  // size, or -1 when none has one. And the result into the shard's gradient.
  int64_t gather_present_grads();
  void accumulate_present_grads(const torch::Tensor& result);
  void point_orig_grads();

  FlatParamUnit& unit_;
  std::shared_ptr<Work> reduce_work_;
  torch::Tensor reduce_in_;
  torch::Tensor reduce_out_;
  bool host_copy_pending_ = false;
  std::vector<torch::Tensor> orig_params_;  // use_orig_params: views of the shard, one per slot
  std::vector<size_t> reduced_;             // per-parameter: the slots in the reduction in flight
  std::vector<bool> present_;               // per-parameter: the slots whose shard part holds a gradient
};

}  // namespace lockstep::fsdp
