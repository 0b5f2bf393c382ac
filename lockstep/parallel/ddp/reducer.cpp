#include "lockstep/parallel/ddp/reducer.h"

#include <ATen/ScalarOps.h>

#include <algorithm>
#include <unordered_set>

#include "lockstep/compat/autograd.h"
#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/comm/agreement.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/ddp/bucket_assignment.h"
#include "lockstep/parallel/ddp/internal/iteration_check.h"

namespace lockstep {
namespace {

using Clock = ReductionTimeline::Clock;

bool same_memory(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() &&
         a.strides() == b.strides();
}

std::string join_names(const std::vector<std::string>& names, size_t limit = 20) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < limit; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > limit) text += ", ... (" + std::to_string(names.size() - limit) + " more)";
  return text;
}

// The parameters (by index) whose gradient accumulators `loss`'s graph does
// not reach: those it leaves without a gradient.
std::vector<size_t> unreached_parameters(const torch::Tensor& loss,
                                         const std::vector<std::unique_ptr<compat::PostAccumulateHook>>& hooks) {
  std::unordered_set<const torch::autograd::Node*> graph;
  for (const auto* node : compat::reachable_nodes(loss)) graph.insert(node);
  std::vector<size_t> unused;
  for (size_t i = 0; i < hooks.size(); ++i) {
    if (graph.count(hooks[i]->accumulator()) == 0) unused.push_back(i);
  }
  return unused;
}

// The error of a backward pass that left parameters without a gradient.
std::exception_ptr unready_error(const std::vector<bool>& ready, const std::vector<std::string>& names) {
  std::vector<std::string> missing;
  for (size_t i = 0; i < ready.size(); ++i) {
    if (!ready[i]) missing.push_back(names[i]);
  }
  return std::make_exception_ptr(Error(str_cat(
      "the backward pass finished but ", missing.size(), " parameter(s) received no gradient, so their buckets "
      "could not be reduced: ", join_names(missing), ". If some parameters do not take part in every loss, "
      "construct DDP with find_unused_parameters: true (or static_graph: true when the set never changes).")));
}

}  // namespace

Reducer::Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<ProcessGroup> group, ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      check_(std::make_unique<detail::IterationCheck>()) {
  LOCKSTEP_CHECK(group_ != nullptr, "DDP needs a process group");
  LOCKSTEP_CHECK(!params_.empty(), "DDP needs at least one parameter that requires grad");
  LOCKSTEP_CHECK(params_.size() == names_.size(), "Reducer: ", params_.size(), " parameters but ", names_.size(), " names");
  LOCKSTEP_CHECK(options_.first_bucket_bytes() > 0 && options_.bucket_bytes() > 0, "bucket sizes must be positive");
  locally_used_.assign(params_.size(), 0);
  globally_used_.assign(params_.size(), 1);
  expected_hook_calls_.assign(params_.size(), 0);
  build_buckets_from(initial_buckets(params_, {options_.first_bucket_bytes(), options_.bucket_bytes()},
                                     options_.static_graph() || !options_.find_unused_parameters()));
  hooks_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    hooks_.push_back(std::make_unique<compat::PostAccumulateHook>(params_[i], [this, i] { autograd_hook(i); }));
  }
}

Reducer::~Reducer() {
  // Remove the hooks before the state they use goes away.
  hooks_.clear();
}

void Reducer::set_comm_hook(std::shared_ptr<CommHook> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  LOCKSTEP_CHECK(hook != nullptr, "register_comm_hook(nullptr)");
  LOCKSTEP_CHECK(!reducing(), "a communication hook cannot change during a backward pass");
  comm_hook_ = std::move(hook);
}

std::shared_ptr<CommHook> Reducer::comm_hook() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return comm_hook_;
}

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rebuild_pending_ && !reducing()) rebuild_buckets_from_rank0();
}

void Reducer::set_local_accumulation_allowed(bool allowed) {
  std::lock_guard<std::mutex> lock(mutex_);
  local_accumulation_allowed_ = allowed;
}

void Reducer::prepare_for_backward(const torch::Tensor& loss, bool sync, int64_t iteration) {
  std::lock_guard<std::mutex> lock(mutex_);
  LOCKSTEP_CHECK(!reducing(), "DDP: a new backward pass started before the previous one finished its gradient "
                 "reduction on this rank (did an earlier backward raise?)");
  if (!sync) {  // no_sync: hooks only record which parameters were used
    enter(Phase::kLocalBackward);
    return;
  }
  if (rebuild_pending_) rebuild_buckets_from_rank0();
  start_pass(iteration);
  if (options_.static_graph()) {
    // First iteration: hooks only count; everything is reduced at the end.
  } else if (options_.find_unused_parameters()) {
    unused_ = unreached_parameters(loss, hooks_);
  }
  for (size_t index : unused_) mark_variable_ready(index);
}

void Reducer::start_pass(int64_t iteration) {
  enter(Phase::kReducing);
  iteration_ = iteration;
  exchange_used_map_ = options_.find_unused_parameters() || (options_.static_graph() && !static_graph_learned_);
  next_bucket_ = 0;
  ready_.assign(params_.size(), false);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.variables.size();
    bucket.reduction.reset();
  }
  check_->reset();
  timeline_ = ReductionTimeline();
  timeline_.bucket_launched.assign(buckets_.size(), Clock::time_point());
  if (!rebuilt_) ready_order_.clear();

  unused_.clear();
  if (options_.static_graph() && static_graph_learned_) {
    remaining_hook_calls_ = expected_hook_calls_;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (expected_hook_calls_[i] == 0) unused_.push_back(i);
    }
  }
  // Without a used map, the check goes out now (Note [The iteration check]).
  if (!exchange_used_map_ && group_->size() > 1) {
    timeline_.check_launched = Clock::now();
    check_->launch(*group_, iteration_, !diverged_reason_.empty(), nullptr);
  }
}

void Reducer::autograd_hook(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == Phase::kIdle) {
    // A gradient DDP was not told about: a backward outside the
    // OptimWrapper's update_params / backward (a custom train_step calling
    // loss.backward() itself). Reducing nothing would train every rank on its
    // own with no sign of it, so fail, unless no_sync() allows local
    // accumulation.
    if (local_accumulation_allowed_) return;
    LOCKSTEP_FAIL("DDP on rank ", group_->global_rank(group_->rank()), ": parameter '", names_[index],
                  "' received a gradient from a backward pass DDP was not told about, so it would not be "
                  "averaged across ranks and each rank would train its own model. Run backward through the optim "
                  "wrapper (optim_wrapper.update_params(loss), or optim_wrapper.backward(loss) then step()), not "
                  "loss.backward(); for a backward that must stay local, open ddp.no_sync() around it.");
  }
  locally_used_[index] = 1;
  if (phase_ == Phase::kLocalBackward) return;
  timeline_.last_hook = Clock::now();
  if (phase_ == Phase::kReducing) {
    enter(Phase::kFinalizeQueued);
    compat::queue_backward_callback([this] { finalize_backward(); });
  }
  if (options_.static_graph()) {
    if (!static_graph_learned_) {
      if (expected_hook_calls_[index]++ == 0) ready_order_.push_back(index);
      return;
    }
    if (--remaining_hook_calls_[index] > 0) return;  // this parameter is used again later in the pass
  }
  mark_variable_ready(index);
}

// Note [Dividing by the world size]
// DDP averages: every rank's gradient is divided by the world size N and
// the buckets are summed across ranks. Without a comm hook the division is
// done where the gradient is copied into its bucket view anyway: one pass, a
// multiply by 1/N written straight into the bucket (at::mul_out, the fused
// multiply of PyTorch's reducer), after which the bucket is all-reduced with
// SUM; a parameter without a gradient contributes zeros. When .grad already
// is the view there is nothing to copy, and the view is divided in place
// (Note [Gradients as bucket views]). OptimWrapper::zero_grad sets .grad to
// none for bucket views too, so the next gradients are copied into the
// buckets, divided on the way, instead of being added to zeroed ones and then
// divided. With a comm hook the gradients enter the bucket as autograd left
// them (GradBucket's buffer is NOT divided), and the hook divides by the
// world size itself, where it suits its arithmetic (comm_hook.h): allreduce
// divides and then sums; fp16/bf16_compress cast first and divide in the
// compressed dtype (keeps the sum in range); PowerSGD divides after its
// projections. Hooks written for the older launch() contract still receive
// the bucket divided: CommHook::run divides before calling launch().
void Reducer::mark_variable_ready(size_t index) {
  LOCKSTEP_ASSERT(reducing(), "DDP parameter '", names_[index], "' marked ready outside a synchronised backward");
  LOCKSTEP_CHECK(!ready_[index], "DDP: parameter '", names_[index], "' became ready twice in one backward pass. "
                 "Either it is used in several reentrant backward passes (activation checkpointing), or "
                 "outside the forward; static_graph=true supports a parameter that is used several times "
                 "in the same graph.");
  ready_[index] = true;
  if (!rebuilt_) ready_order_.push_back(index);
  const Location& location = locations_[index];
  Bucket& bucket = buckets_[location.bucket];
  torch::Tensor& view = bucket.views[location.slot];
  auto& grad = params_[index].mutable_grad();
  if (grad.defined()) {
    LOCKSTEP_CHECK(!grad.is_sparse(), "DDP: parameter '", names_[index], "' has a sparse gradient, which DDP does not reduce");
    // Note [Dividing by the world size].
    if (same_memory(grad, view)) {
      if (!comm_hook_) view.div_(group_->size());
    } else {
      if (comm_hook_) {
        view.copy_(grad);
      } else {
        torch::Tensor factor = c10::scalar_to_tensor(1.0 / static_cast<double>(group_->size()));
        factor.unsafeGetTensorImpl()->set_wrapped_number(true);
        at::mul_out(view, grad, factor);
      }
      if (options_.gradient_as_bucket_view()) grad = view;
    }
  } else {
    view.zero_();
  }
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_];
    timeline_.bucket_launched[next_bucket_] = Clock::now();
    if (comm_hook_) {
      std::vector<torch::Tensor> parameters;
      for (size_t index : bucket.variables) parameters.push_back(params_[index]);
      GradBucket view(next_bucket_, bucket.flat, bucket.views, std::move(parameters),
                      next_bucket_ + 1 == buckets_.size());
      bucket.reduction = comm_hook_->run(*group_, view);
      LOCKSTEP_CHECK(bucket.reduction != nullptr, "comm hook '", comm_hook_->name(), "' returned no pending reduction "
                     "for bucket ", next_bucket_);
    } else {
      bucket.reduction = std::make_unique<PendingReduction>(group_->all_reduce(bucket.flat, ReduceOp::kSum, true));
    }
    ++next_bucket_;
  }
  if (next_bucket_ == buckets_.size() && exchange_used_map_ && group_->size() > 1) {
    timeline_.check_launched = Clock::now();
    check_->launch(*group_, iteration_, !diverged_reason_.empty(), &locally_used_);
  }
}

// Note [Dropping a failed step]
// A rank whose step fails before its gradients are reduced (an exception in
// autograd: a hook, a NaN check, an out-of-memory; parameters left without a
// gradient) used to stop taking part, while the others sat in the pass's
// collectives until the timeout, and its reducer stayed mid-pass. Instead it
// now completes the pass: every parameter not ready yet contributes zeros,
// every bucket is launched and waited for, and then all ranks agree on the
// outcome (comm/agreement.h), as every synchronised pass ends. Where a rank
// failed, every rank drops its gradients, ends the pass and throws the same
// error, so no rank steps its optimizer: the weights stay equal everywhere and
// a program that owns its loop can catch the error on every rank and go on
// with the next step. The agreement costs one tiny all-reduce per synchronised
// backward (bench/ddp measures it). A failure after the reduction (in the
// optimizer step) cannot be dropped this way, since the others have stepped:
// mark_diverged() makes the next pass's iteration check fail on every rank.
void Reducer::abandon_pass(const std::exception_ptr& error) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    ready_[i] = true;
    const Location& location = locations_[i];
    buckets_[location.bucket].views[location.slot].zero_();
    --buckets_[location.bucket].pending;
  }
  try {
    launch_ready_buckets();
    check_->wait();
    for (auto& bucket : buckets_) {
      if (bucket.reduction) bucket.reduction->wait();
    }
  } catch (...) {
    // A peer that died breaks these collectives; the agreement below then
    // fails too and says so, with this rank's own error.
  }
  try {
    agree_on_outcome(*group_, str_cat("DDP: the step of iteration ", iteration_, " was dropped on every rank"), error);
  } catch (...) {
    drop_gradients();
    throw;
  }
  LOCKSTEP_ASSERT(false, "DDP: the agreement on a failed pass did not fail");
  std::rethrow_exception(error);
}

void Reducer::drop_gradients() {
  for (auto& param : params_) param.mutable_grad().reset();
  if (options_.static_graph() && !static_graph_learned_) {
    // What the dropped first pass counted is learned again by the next one.
    std::fill(expected_hook_calls_.begin(), expected_hook_calls_.end(), 0);
    ready_order_.clear();
  }
  std::fill(locally_used_.begin(), locally_used_.end(), 0);
  check_->reset();
  abandoned_iteration_ = iteration_;
  end_pass();
}

void Reducer::abandon(const std::exception_ptr& error, bool start, int64_t iteration) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!reducing()) {
    if (!start || abandoned_iteration_ == iteration) return;
    if (rebuild_pending_) rebuild_buckets_from_rank0();
    start_pass(iteration);
  }
  abandon_pass(error);
}

void Reducer::mark_diverged(int64_t iteration, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (diverged_reason_.empty()) diverged_reason_ = str_cat("iteration ", iteration, ": ", reason);
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!reducing()) return;  // finish_backward got here first, or a failure ended the pass
  timeline_.backward_finished = Clock::now();
  const bool learning_static_graph = options_.static_graph() && !static_graph_learned_;
  if (learning_static_graph) {
    // The first iteration of a static graph reduces at the end, in the order
    // the hooks fired, once every gradient is complete. It is learned once
    // every rank agrees the pass succeeded (a dropped pass is learned again).
    std::vector<size_t> order = ready_order_;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (expected_hook_calls_[i] == 0) order.push_back(i);
    }
    ready_order_.clear();  // marking records the order again, for the rebuild
    for (size_t index : order) mark_variable_ready(index);
  }
  if (next_bucket_ < buckets_.size()) abandon_pass(unready_error(ready_, names_));
  const bool track_used = options_.find_unused_parameters() || options_.static_graph();
  try {
    // The check left before every bucket: read it first, so that ranks out of
    // step are named even when their buckets' collectives no longer match
    // (Note [The iteration check]).
    if (!exchange_used_map_) check_->verify(*group_, diverged_reason_, nullptr);
    for (auto& bucket : buckets_) {
      torch::Tensor result = bucket.reduction->wait();
      if (result.defined() && !same_memory(result, bucket.flat)) bucket.flat.copy_(result);
    }
    if (check_->launched()) {
      check_->verify(*group_, diverged_reason_, exchange_used_map_ ? &globally_used_ : nullptr);
    } else if (track_used) {
      globally_used_ = locally_used_;
    }
    // Every rank completed this pass, or every rank drops it (Note [Dropping a failed step]).
    agree_on_outcome(*group_, str_cat("DDP: the step of iteration ", iteration_, " was dropped on every rank"),
                     std::exception_ptr());
  } catch (...) {
    // Ranks out of step, a collective that failed or timed out (a peer died,
    // a link went down), or a failure another rank reported: the pass ends
    // here, with no gradient kept. Nothing is left to abandon: the group
    // itself failed, or every rank already knows.
    drop_gradients();
    throw;
  }
  if (learning_static_graph) static_graph_learned_ = true;

  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& view = buckets_[locations_[i].bucket].views[locations_[i].slot];
    auto& grad = params_[i].mutable_grad();
    if (track_used && !globally_used_[i]) {
      // Note [Unused parameters get no gradient]
      // With find_unused_parameters or static_graph, the used map of the
      // iteration check (Note [The iteration check]) says which parameters
      // some rank used. A parameter unused only on this rank is marked ready
      // without its hook firing (contributing zeros when it holds no
      // gradient) and gets the average like any other. Unused on every rank:
      // no gradient (zero_grad dropped it and nothing created it), so the
      // optimizer skips it, with or without gradient_as_bucket_view. A bucket
      // view still held from an earlier step (no zero_grad in between) stands
      // for "no gradient" too; kept, it would let momentum move the parameter
      // in one mode and not the other.
      if (options_.gradient_as_bucket_view() && same_memory(grad, view)) grad.reset();
      continue;
    }
    if (options_.gradient_as_bucket_view()) {
      if (!same_memory(grad, view)) grad = view;
    } else if (grad.defined()) {
      grad.copy_(view);
    } else {
      grad = view.clone();
    }
  }
  end_pass();
  std::fill(locally_used_.begin(), locally_used_.end(), 0);
  check_->reset();
  // Buckets are rebuilt once, in the order gradients became ready -- except
  // with find_unused_parameters (and no static graph), where that order may
  // change from one iteration to the next (Note [Bucket order and rebuild]).
  if (!rebuilt_ && (options_.static_graph() || !options_.find_unused_parameters())) rebuild_pending_ = true;
}

void Reducer::finish_backward() {
  bool needs_finalize = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!reducing()) {  // a no_sync pass, or one a failure already ended
      end_pass();
      return;
    }
    needs_finalize = true;
  }
  // No hook ran (every parameter unused on this rank): finish here instead of
  // in the autograd callback.
  if (needs_finalize) finalize_backward();
}

void Reducer::enter(Phase next) {
  constexpr unsigned kQuiet = phase_bit(Phase::kIdle) | phase_bit(Phase::kLocalBackward);
  constexpr unsigned kMayComeFrom[] = {kFromAny, kQuiet, kQuiet, phase_bit(Phase::kReducing)};
  constexpr const char* kNames[] = {"idle", "a no_sync backward", "a synchronised backward before its first hook",
                                    "a synchronised backward with its hooks firing"};
  move_phase("the DDP reducer", phase_, next, kMayComeFrom, kNames);
}

void Reducer::end_pass() { enter(Phase::kIdle); }

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<size_t>> result;
  for (const auto& bucket : buckets_) result.push_back(bucket.variables);
  return result;
}

ReductionTimeline Reducer::last_timeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_;
}

}  // namespace lockstep
