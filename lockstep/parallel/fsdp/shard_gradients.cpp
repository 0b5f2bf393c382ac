// fsdp::ShardGradients: a unit's gradients, from autograd's to the shard's
// (shard_gradients.h).
#include "lockstep/parallel/fsdp/shard_gradients.h"

#include <algorithm>

#include "lockstep/compat/cuda.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/fsdp/flat_param.h"
#include "lockstep/parallel/fsdp/internal/unit_wait.h"

namespace lockstep::fsdp {

ShardGradients::~ShardGradients() {
  // Never leave a reduction writing into memory about to be released.
  try {
    if (reduce_work_) reduce_work_->wait();
  } catch (...) {
  }
}

bool ShardGradients::reduce_pending() const { return reduce_work_ != nullptr || reduce_out_.defined(); }

void ShardGradients::absorb(size_t index) {
  // FSDP2 keeps them until the reduction: which arrived decides its layout.
  if (unit_.layout().per_parameter()) return;
  FlatSlot& slot = unit_.slots_.at(index);
  torch::Tensor& grad = slot.param.mutable_grad();
  if (!grad.defined()) return;
  LOCKSTEP_ASSERT(!reduce_work_, "FSDP unit '", unit_.path(), "' got a gradient while its reduction runs");
  torch::NoGradGuard no_grad;
  if (!reduce_in_.defined()) {
    reduce_in_ = torch::zeros({unit_.layout().padded_numel}, unit_.full().options().dtype(unit_.setup().reduce_dtype));
  }
  reduce_in_.narrow(0, slot.offset, slot.numel).copy_(grad.reshape(-1));
  grad.reset();
}

// Note [FSDP's pre- and post-divide]
// FSDP averages a unit's gradients over the data-parallel world of N ranks
// (the whole FSDP group: with HYBRID_SHARD, the shard group and its replicas
// together), but its collectives sum. Dividing by N once, before the sum,
// could make low-precision gradients (reduce_dtype fp16 or bf16) underflow;
// dividing once after it could make the sum overflow. So, as PyTorch's FSDP
// does, the division is split in two whose product is N
// (gradient_divide_factors, PyTorch's
// DefaultState._get_gradient_predivide_factor: about sqrt(N) each,
// e.g. 2 and 2 for N=4, 4 and 2 for N=8): start_reduce divides the flat
// gradient by `predivide` before the reduce-scatter over the shard group (or
// the all-reduce over the replicas without sharding), and finish_reduce
// divides the result by `postdivide` once every sum is done, after
// HYBRID_SHARD's all-reduce across replicas too. Both divisions are made in
// reduce_dtype, before the result is converted to the shard's dtype and added
// into the shard's .grad. (DDP without a comm hook divides once, before the
// sum: Note [Dividing by the world size].)
void ShardGradients::start_reduce() {
  LOCKSTEP_ASSERT(!reduce_work_ && !reduce_out_.defined(), "FSDP unit '", unit_.path(),
                 "' reduces twice in one backward");
  torch::NoGradGuard no_grad;
  int64_t out_numel = unit_.layout().shard_numel;
  if (unit_.layout().per_parameter()) {
    out_numel = gather_present_grads();
    if (out_numel < 0) return;  // no parameter of the unit got a gradient: nothing to reduce
  } else {
    for (size_t s = 0; s < unit_.slots().size(); ++s) absorb(s);
    if (!reduce_in_.defined()) {
      reduce_in_ =
          torch::zeros({unit_.layout().padded_numel}, unit_.full().options().dtype(unit_.setup().reduce_dtype));
    }
  }
  if (unit_.setup().predivide != 1) reduce_in_.div_(unit_.setup().predivide);
  if (unit_.layout().shard_world > 1) {
    reduce_out_ = torch::empty({out_numel}, reduce_in_.options());
    if (unit_.setup().step_check) unit_.setup().step_check->record(unit_.index(), StepCheck::Kind::kReduce);
    reduce_work_ =
        unit_.setup().shard_group->reduce_scatter_tensor(reduce_out_, reduce_in_, ReduceOp::kSum, /*async=*/true);
  } else {
    reduce_out_ = reduce_in_;
    if (unit_.setup().replicate_group && unit_.setup().replicate_group->size() > 1) {
      if (unit_.setup().step_check) unit_.setup().step_check->record(unit_.index(), StepCheck::Kind::kReplicaReduce);
      reduce_work_ = unit_.setup().replicate_group->all_reduce(reduce_out_, ReduceOp::kSum, /*async=*/true);
    }
  }
}

// Note [FSDP2's gradients]
// PyTorch's fully_shard reduces, after a unit's backward, only the gradients
// autograd produced: a parameter the loss did not reach takes no part in the
// reduce-scatter and keeps no gradient, on every rank, so an optimizer skips
// it (no weight decay, no momentum) exactly as under DDP. FSDP1's flat
// parameter instead reduces zeros for it and decays it. So under the
// per-parameter layout the reduce-scatter input holds the blocks of the
// parameters that have a gradient, in slot order, each in the layout of
// Note [Per-parameter layout] (PyTorch's _chunk_cat): the same buffer, and so
// the same sums, as PyTorch's. Every rank must reduce the same parameters or
// the buffers differ in size; the set goes into the step check (Note [FSDP's
// step check]), which names the difference. The result is added into the
// shard's gradient block by block, and present_ remembers which parameters
// have one, for the views the optimizer steps (point_orig_grads).
int64_t ShardGradients::gather_present_grads() {
  const ShardLayout& layout = unit_.layout();
  reduced_.clear();
  uint64_t set_hash = 1469598103934665603ULL;
  for (size_t s = 0; s < unit_.slots().size(); ++s) {
    if (!unit_.slots()[s].param.grad().defined()) continue;
    reduced_.push_back(s);
    set_hash = (set_hash ^ (s + 1)) * 1099511628211ULL;
  }
  if (reduced_.empty()) return -1;
  int64_t out_numel = 0;
  for (size_t s : reduced_) out_numel += layout.blocks[s].chunk;
  reduce_in_ = torch::zeros({out_numel * layout.shard_world}, unit_.full().options().dtype(unit_.setup().reduce_dtype));
  if (unit_.setup().step_check) unit_.setup().step_check->record(unit_.index(), StepCheck::Kind::kReduceSet, set_hash);
  int64_t in_row = 0;
  for (size_t s : reduced_) {
    const LayoutBlock& block = layout.blocks[s];
    torch::Tensor& grad = unit_.slots_[s].param.mutable_grad();
    const torch::Tensor flat = grad.reshape(-1);
    for (int r = 0; r < layout.shard_world; ++r) {
      const int64_t length = std::clamp<int64_t>(block.numel - r * block.chunk, 0, block.chunk);
      if (length > 0) reduce_in_.narrow(0, r * out_numel + in_row, length).copy_(flat.narrow(0, r * block.chunk, length));
    }
    in_row += block.chunk;
    grad.reset();
  }
  return out_numel;
}

void ShardGradients::accumulate_present_grads(const torch::Tensor& result) {
  torch::Tensor& grad = unit_.shard().mutable_grad();
  if (!grad.defined()) grad = torch::zeros(unit_.shard().sizes(), unit_.shard().options().requires_grad(false));
  if (present_.size() != unit_.slots().size()) present_.assign(unit_.slots().size(), false);
  int64_t in_result = 0;
  for (size_t s : reduced_) {
    const LayoutBlock& block = unit_.layout().blocks[s];
    torch::Tensor target = grad.narrow(0, block.shard_offset, block.chunk);
    // Offloaded, the shard's gradient is on the host: a blocking copy (no pinned fast path here yet).
    const torch::Tensor value = result.narrow(0, in_result, block.chunk).to(grad.device(), grad.scalar_type());
    if (present_[s]) {
      target.add_(value);
    } else {
      target.copy_(value);
      present_[s] = true;
    }
    in_result += block.chunk;
  }
  reduced_.clear();
}

void ShardGradients::finish_reduce() {
  if (!reduce_pending()) return;
  torch::NoGradGuard no_grad;
  if (reduce_work_) {
    auto work = std::move(reduce_work_);
    reduce_work_.reset();
    wait_for_unit(*work, unit_.path(), "reducing its gradients");
  }
  if (unit_.setup().shard_postdivide != 1) reduce_out_.div_(unit_.setup().shard_postdivide);
  if (unit_.layout().shard_world > 1 && unit_.setup().replicate_group && unit_.setup().replicate_group->size() > 1) {
    if (unit_.setup().step_check) unit_.setup().step_check->record(unit_.index(), StepCheck::Kind::kReplicaReduce);
    unit_.setup().replicate_group->all_reduce(reduce_out_, ReduceOp::kSum);
  }
  if (unit_.setup().postdivide != 1) reduce_out_.div_(unit_.setup().postdivide);
  torch::Tensor result = reduce_out_;
  reduce_in_ = torch::Tensor();
  reduce_out_ = torch::Tensor();
  collect_orig_grads();
  if (unit_.layout().per_parameter()) {
    accumulate_present_grads(result);
  } else {
    accumulate_shard_grad(std::move(result));
  }
  point_orig_grads();
}

void ShardGradients::accumulate_shard_grad(torch::Tensor result) {
  torch::Tensor& grad = unit_.shard().mutable_grad();
  if (unit_.pinned_offload_ && !grad.defined()) {
    // To pinned host memory without blocking: the next unit's reduction goes
    // on meanwhile, and wait_for_host_copies() waits once for all of them.
    grad = torch::empty(unit_.shard().sizes(), unit_.shard().options().requires_grad(false).pinned_memory(true));
    grad.copy_(result, /*non_blocking=*/true);
    host_copy_pending_ = true;
    return;
  }
  if (result.scalar_type() != unit_.shard().scalar_type() || result.device() != unit_.shard().device()) {
    // Accumulating into a host gradient reads it now: a blocking copy.
    wait_for_host_copies();
    result = result.to(unit_.shard().options().requires_grad(false));
  }
  if (grad.defined()) {
    grad.add_(result);
  } else {
    grad = result;
  }
}

void ShardGradients::expose_orig_params() {
  if (!orig_params_.empty()) return;
  torch::Tensor memory = unit_.shard().detach();
  for (size_t s = 0; s < unit_.slots().size(); ++s) {
    const ShardOverlap part = unit_.shard_part(s);
    torch::Tensor view = memory.narrow(0, part.in_shard, part.length);
    view.requires_grad_(unit_.slots()[s].trainable);
    orig_params_.push_back(std::move(view));
  }
}

void ShardGradients::collect_orig_grads() {
  if (orig_params_.empty()) return;
  bool any_kept = false;
  for (size_t s = 0; s < orig_params_.size(); ++s) {
    any_kept = any_kept || (unit_.shard_part(s).length > 0 && orig_params_[s].grad().defined());
  }
  torch::Tensor& grad = unit_.shard().mutable_grad();
  if (unit_.layout().per_parameter()) {
    present_.assign(orig_params_.size(), false);
    for (size_t s = 0; s < orig_params_.size(); ++s) present_[s] = orig_params_[s].grad().defined();
  }
  if (!any_kept) {
    grad.reset();  // zero_grad dropped them all (or there were none)
    return;
  }
  wait_for_host_copies();
  torch::NoGradGuard no_grad;
  if (!grad.defined()) grad = torch::zeros(unit_.shard().sizes(), unit_.shard().options().requires_grad(false));
  for (size_t s = 0; s < orig_params_.size(); ++s) {
    const torch::Tensor& view_grad = orig_params_[s].grad();
    const ShardOverlap part = unit_.shard_part(s);
    if (part.length == 0) continue;
    torch::Tensor target = grad.narrow(0, part.in_shard, part.length);
    if (!view_grad.defined()) {
      target.zero_();
    } else if (view_grad.data_ptr() != target.data_ptr()) {
      target.copy_(view_grad.reshape(-1));
    }
  }
}

void ShardGradients::point_orig_grads() {
  if (orig_params_.empty()) return;
  const torch::Tensor& grad = unit_.shard().grad();
  for (size_t s = 0; s < orig_params_.size(); ++s) {
    const ShardOverlap part = unit_.shard_part(s);
    const bool has_grad = grad.defined() && (!unit_.layout().per_parameter() || present_.at(s));
    orig_params_[s].mutable_grad() = has_grad ? grad.narrow(0, part.in_shard, part.length) : torch::Tensor();
  }
}

void ShardGradients::wait_for_host_copies() {
  if (!host_copy_pending_) return;
  compat::synchronize_cuda(unit_.setup().compute_device.index());
  host_copy_pending_ = false;
}

int64_t ShardGradients::bytes() const {
  int64_t bytes = 0;
  auto add = [&bytes](const torch::Tensor& tensor) {
    if (tensor.defined()) bytes += static_cast<int64_t>(tensor.numel() * tensor.element_size());
  };
  for (const auto& slot : unit_.slots()) add(slot.param.grad());
  add(reduce_in_);
  if (reduce_out_.defined() && !reduce_out_.is_same(reduce_in_)) add(reduce_out_);
  add(unit_.shard().grad());
  return bytes;
}

}  // namespace lockstep::fsdp
