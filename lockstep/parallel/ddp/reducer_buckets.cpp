// Reducer's buckets: which parameters share one, in what order, and the
// rebuild after the first iteration (Note [Bucket order and rebuild]); the
// reduction of each pass is in reducer.cpp.
#include <algorithm>

#include "lockstep/core/error.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/ddp/bucket_assignment.h"
#include "lockstep/parallel/ddp/reducer.h"

namespace lockstep {
namespace {

torch::Tensor bucket_view(const torch::Tensor& flat, int64_t offset, const torch::Tensor& param) {
  if (param.is_contiguous()) return flat.narrow(0, offset, param.numel()).view(param.sizes());
  // channels-last and other dense layouts: keep the parameter's strides so
  // that .grad can alias the view.
  LOCKSTEP_CHECK(param.is_non_overlapping_and_dense(),
                 "DDP supports parameters with dense layouts only (got strides ", param.strides(), ")");
  return flat.as_strided(param.sizes(), param.strides(), flat.storage_offset() + offset);
}

}  // namespace

void Reducer::build_buckets(const std::vector<size_t>& order) {
  build_buckets_from(assign_buckets(params_, order, {options_.first_bucket_bytes(), options_.bucket_bytes()}));
}

// Note [Gradients as bucket views]
// With gradient_as_bucket_view a parameter's .grad is not a tensor of its own
// but its view into the bucket's flat buffer (bucket_view keeps the
// parameter's strides, so that channels-last and other dense layouts can
// alias it too). After the reduction the averaged gradient is already where
// .grad points: finalize_backward copies nothing back (without the option it
// copies each view into .grad, or clones it), and no copy of the gradients
// is kept outside the buckets. When a gradient arrives, mark_variable_ready
// finds one of two cases: .grad already is the view (an earlier pass left it
// there and nothing dropped it since, so autograd accumulated into the
// bucket in place), and the view is divided in place; or .grad is a tensor
// autograd has just made (the first backward, or after zero_grad, which sets
// .grad to none as PyTorch 2 does: OptimWrapper::zero_grad), and it is
// copied, divided, into the view and .grad is pointed at the view
// (Note [Dividing by the world size]). Because gradients may live in the
// buckets between steps, a rebuild (Note [Bucket order and rebuild]) keeps
// the old buckets until their gradients have been copied into the new ones
// and .grad re-pointed (below); without the option the old buckets go first.
// A view still held by a parameter unused on every rank is dropped
// (Note [Unused parameters get no gradient]).
void Reducer::build_buckets_from(const std::vector<std::vector<size_t>>& assignment) {
  std::vector<Bucket> buckets(assignment.size());
  locations_.assign(params_.size(), Location{});
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.variables = assignment[b];
    int64_t total = 0;
    for (size_t index : bucket.variables) total += params_[index].numel();
    const torch::Tensor& first = params_[bucket.variables.front()];
    bucket.flat = torch::zeros({total}, torch::TensorOptions().dtype(first.scalar_type()).device(first.device()));
    int64_t offset = 0;
    for (size_t slot = 0; slot < bucket.variables.size(); ++slot) {
      const size_t index = bucket.variables[slot];
      torch::Tensor view = bucket_view(bucket.flat, offset, params_[index]);
      auto& grad = params_[index].mutable_grad();
      // Gradients accumulated in the old buckets move into the new ones.
      if (options_.gradient_as_bucket_view() && grad.defined()) {
        view.copy_(grad);
        grad = view;
      }
      bucket.views.push_back(view);
      locations_[index] = Location{b, slot};
      offset += params_[index].numel();
    }
  }
  buckets_ = std::move(buckets);
}

// Note [Bucket order and rebuild]
// Buckets are launched strictly in bucket order on every rank, so which
// parameters share a bucket, and in what order, decides how early
// communication starts and in which order gradients are summed. The first
// iteration's buckets are PyTorch's (bucket_assignment.h: initial_buckets),
// so that a run sums in the same order as PyTorch's DistributedDataParallel
// and stays bitwise equal to it: without find_unused_parameters (or with
// static_graph) one bucket holding every parameter in model order, reduced
// once the whole backward is done, since the real gradient order is unknown
// until then; with find_unused_parameters the model order cut at the size
// limits (first_bucket_bytes, then bucket_bytes), the last layers' bucket
// first.
//
// After the first synchronised backward the buckets are rebuilt once, in the
// order gradients actually became ready (ready_order_; a static graph's first
// pass records the order its hooks fired). Ranks may observe different
// orders, so rank 0's is broadcast and every rank builds the same buckets;
// parameters that never became ready go last, in reverse model order. The
// rebuild runs in prepare_for_forward, before the second forward, so that the
// new buckets are allocated before activations fill memory (prepare_for_backward
// and abandon run it when no forward announced itself). It is not done with
// find_unused_parameters and no static graph, where that order may change
// from one iteration to the next (PyTorch's reducer does the same). The old
// buckets go before the new ones are allocated, unless gradients still live
// in them (Note [Gradients as bucket views]). The rebuilt order is saved with
// the optim wrapper (DistributedDataParallel::state, "bucket_order") and
// restored by restore_rebuilt_order, so a resumed run sums gradients in the
// same order as the uninterrupted one. Since buckets change after the first
// iteration, a comm hook's memories kept per bucket may only start from the
// second (PowerSGD's start_powerSGD_iter, powersgd_hook.cpp).
void Reducer::rebuild_buckets_from_rank0() {
  const size_t n = params_.size();
  // Parameters that never became ready go last, in reverse model order.
  std::vector<size_t> order = ready_order_;
  std::vector<bool> listed(n, false);
  for (size_t index : order) listed[index] = true;
  for (size_t index : reverse_order(n)) {
    if (!listed[index]) order.push_back(index);
  }
  torch::Tensor shared = torch::tensor(std::vector<int64_t>(order.begin(), order.end()), torch::kLong);
  if (group_->size() > 1) group_->broadcast(shared, 0);
  std::vector<size_t> agreed(n);
  for (size_t i = 0; i < n; ++i) agreed[i] = static_cast<size_t>(shared[static_cast<int64_t>(i)].item<int64_t>());
  // The old buckets go before the new ones are allocated, unless gradients
  // still live in them (gradient_as_bucket_view), to be moved across.
  if (!options_.gradient_as_bucket_view()) buckets_.clear();
  build_buckets(agreed);
  rebuilt_order_ = agreed;
  rebuilt_ = true;
  rebuild_pending_ = false;
}

std::vector<int64_t> Reducer::rebuilt_order() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::vector<int64_t>(rebuilt_order_.begin(), rebuilt_order_.end());
}

void Reducer::restore_rebuilt_order(const std::vector<int64_t>& order) {
  std::lock_guard<std::mutex> lock(mutex_);
  LOCKSTEP_CHECK(!reducing(), "DDP: bucket order restored during a backward pass");
  std::vector<size_t> indices;
  std::vector<bool> seen(params_.size(), false);
  for (int64_t index : order) {
    LOCKSTEP_CHECK(index >= 0 && static_cast<size_t>(index) < params_.size() && !seen[static_cast<size_t>(index)],
                   "DDP: the saved bucket order is not a permutation of this model's ", params_.size(),
                   " parameters (was the checkpoint written for another model?)");
    seen[static_cast<size_t>(index)] = true;
    indices.push_back(static_cast<size_t>(index));
  }
  LOCKSTEP_CHECK(indices.size() == params_.size(), "DDP: the saved bucket order names ", indices.size(),
                 " parameters but the model has ", params_.size());
  if (!options_.gradient_as_bucket_view()) buckets_.clear();
  build_buckets(indices);
  rebuilt_order_ = std::move(indices);
  rebuilt_ = true;
  rebuild_pending_ = false;
}

}  // namespace lockstep
