// FullyShardedDataParallel: the per-iteration life cycle of the units.
//
//   forward   enter_unit: gather (wait for a prefetch), maybe prefetch the next
//             leave_unit: FULL_SHARD / HYBRID_SHARD free; SHARD_GRAD_OP keeps
//   backward  pre_backward (hook on the unit's output gradient): gather again,
//               BACKWARD_PRE prefetches the next unit
//             on_grad_ready (AccumulateGrad post hook) x every parameter: the
//               gradient moves into the unit's flat buffer; then
//             post_backward: reduce-scatter the buffer, free, BACKWARD_POST prefetch
//             finish_backward_pass (autograd's final callback): wait for the
//               reductions, free what backward left gathered
//   step      after_step: re-gather the units that stay gathered (the root:
//             Note [The root unit] in fsdp_setup.cpp)
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <unordered_set>

#include "lockstep/compat/autograd.h"
#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/core/logging.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/model/activation_checkpoint.h"
#include "lockstep/optim/optimizer_state.h"

namespace lockstep {
namespace {
// Reductions left in flight while the next unit's backward runs: each holds
// a unit-sized flat gradient, so one overlaps communication with computation
// and keeps the unsharded gradients at two units (this one's, the next one's).
constexpr size_t kMaxReductionsInFlight = 1;
}  // namespace

// --- forward ---------------------------------------------------------------

void FullyShardedDataParallel::enter_unit(int unit) {
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  if (run.depth > 0) {  // a Sequential entry whose module opens its own scope too
    ++run.depth;
    return;
  }
  throw_pending_error();
  LOCKSTEP_CHECK(!in_backward(), "FSDP: unit '", units_[static_cast<size_t>(unit)]->path(),
                 "' ran forward during a backward pass: an activation checkpoint must sit inside the unit's scope "
                 "(lockstep::checkpointed() between unit_scope() and scope.output()), not around whole units");
  if (!backward_seen_ &&
      std::find(forward_order_.begin(), forward_order_.end(), unit) == forward_order_.end()) {
    forward_order_.push_back(unit);
  }
  units_[static_cast<size_t>(unit)]->mark_intercepted();
  ensure_gathered(*units_[static_cast<size_t>(unit)]);
  if (options_.forward_prefetch()) prefetch(next_in_forward(unit));
  run.entered_ever = true;
  run.output_registered = false;
  run.depth = 1;
  sample_memory();
}

void FullyShardedDataParallel::leave_unit(int unit) noexcept {
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  if (--run.depth > 0) return;
  auto& flat = *units_[static_cast<size_t>(unit)];
  const bool unwinding = std::uncaught_exceptions() > 0;
  const bool grad = torch::GradMode::is_enabled();
  try {
    if (grad && !run.output_registered && !unwinding && pending_error_.empty()) {
      pending_error_ = "FSDP: the forward of unit '" + flat.path() + "' (" + flat.module()->name() +
                       ") opened lockstep::fsdp::unit_scope but returned without passing its result through "
                       "scope.output(y): its backward would find the parameters freed. Return scope.output(y).";
    }
    const bool free_after_forward = options_.sharding_strategy() == ShardingStrategy::kFullShard ||
                                    options_.sharding_strategy() == ShardingStrategy::kHybridShard;
    if (!grad || free_after_forward || unwinding) flat.reshard();
    sample_memory();
  } catch (const std::exception& error) {
    if (pending_error_.empty()) pending_error_ = std::string("FSDP: freeing unit '") + flat.path() + "' failed: " + error.what();
  }
}

void FullyShardedDataParallel::register_output(int unit, const torch::Tensor& output) {
  runs_[static_cast<size_t>(unit)].output_registered = true;
  if (!output.defined() || !output.requires_grad() || !torch::GradMode::is_enabled()) return;
  torch::Tensor hooked = output;
  hooked.register_hook([this, unit](const torch::Tensor&) { pre_backward(unit); });
}

void FullyShardedDataParallel::ensure_gathered(fsdp::FlatParamUnit& unit) {
  if (unit.state() == fsdp::FlatParamUnit::State::kSharded) unit.start_gather();
  unit.finish_gather();
  unit.refresh();  // gathered since wrapping, and the shard was loaded or stepped since
  max_gathered_ = std::max(max_gathered_, gathered_units());
}

int FullyShardedDataParallel::gathered_units() const {
  int count = 0;
  for (const auto& unit : units_) {
    if (!unit->persistent() && !unit->aliases_shard() && unit->state() != fsdp::FlatParamUnit::State::kSharded) ++count;
  }
  return count;
}

void FullyShardedDataParallel::prefetch(int unit) {
  if (unit < 0) return;
  auto& flat = *units_[static_cast<size_t>(unit)];
  if (flat.state() != fsdp::FlatParamUnit::State::kSharded) return;
  if (options_.limit_all_gathers() > 0 && gathered_units() >= options_.limit_all_gathers()) return;
  flat.start_gather();
  max_gathered_ = std::max(max_gathered_, gathered_units());
}

int FullyShardedDataParallel::next_in_forward(int unit) const {
  if (!backward_seen_) return -1;  // the order is known after the first iteration
  auto it = std::find(forward_order_.begin(), forward_order_.end(), unit);
  if (it == forward_order_.end() || it + 1 == forward_order_.end()) return -1;
  return *(it + 1);
}

int FullyShardedDataParallel::next_in_backward(int unit) const {
  // Before the first backward has finished, the reverse forward order is the best guess.
  if (!backward_seen_) {
    auto it = std::find(forward_order_.rbegin(), forward_order_.rend(), unit);
    if (it == forward_order_.rend() || it + 1 == forward_order_.rend()) return -1;
    return *(it + 1);
  }
  auto it = std::find(backward_order_.begin(), backward_order_.end(), unit);
  if (it == backward_order_.end() || it + 1 == backward_order_.end()) return -1;
  return *(it + 1);
}

void FullyShardedDataParallel::refresh_persistent_units() {
  for (auto& unit : units_) {
    if (unit->persistent()) unit->refresh();
  }
}

void FullyShardedDataParallel::throw_pending_error() {
  LOCKSTEP_CHECK(broken_.empty(), broken_);
  if (pending_error_.empty()) return;
  std::string message = std::move(pending_error_);
  pending_error_.clear();
  throw Error(message);
}

// --- GradientSync ----------------------------------------------------------

void FullyShardedDataParallel::begin_forward(bool sync) {
  throw_pending_error();
  step_check_->verify();
  sync_ = sync;
  refresh_persistent_units();
  // use_orig_params: a gradient zero_grad dropped from every view is freed now, not at the next reduction.
  for (auto& unit : units_) unit->collect_orig_grads();
}

void FullyShardedDataParallel::begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration) {
  throw_pending_error();
  check_interception();
  sync_ = sync;
  iteration_ = iteration;
  // The forward's unit collectives are compared while backward computes its
  // first layers; checked before backward issues any collective of its own
  // (Note [FSDP's step check]).
  step_check_->launch(iteration_);
  // Which parameters this loss reaches: a unit is complete when those have their gradients.
  // Behind an activation checkpoint the parameters appear only when backward
  // recomputes it: with one in the graph, every parameter counts as reached
  // (a unit then completes when all of its gradients are in, or at the end).
  std::unordered_set<const torch::autograd::Node*> graph;
  bool hidden = false;
  for (const auto* node : compat::reachable_nodes(loss)) {
    graph.insert(node);
    hidden = hidden || is_checkpoint_node(*node);
  }
  for (const auto& unit : units_) {
    UnitRun& run = runs_[static_cast<size_t>(unit->index())];
    run.expected_grads = 0;
    for (size_t s = 0; s < unit->slots().size(); ++s) {
      const bool in_graph = hidden || graph.count(unit->hooks()[s]->accumulator()) > 0;
      run.slot_in_graph[s] = in_graph ? 1 : 0;
      run.expected_grads += in_graph ? 1 : 0;
    }
  }
  // A backward already running (its hooks fired before this call) keeps running, now planned.
  enter(in_backward() ? Phase::kBackward : Phase::kPlanned);
}

void FullyShardedDataParallel::end_backward(bool /*sync*/) {
  if (in_backward()) {
    finish_backward_pass();  // autograd never ran the final callback (no hook fired after it was queued)
  } else {
    // A backward that reached none of FSDP's parameters: only clean up.
    for (auto& unit : units_) unit->reshard();
    reset_backward_state();
  }
  // Every rank ends each backward here: the backward's unit collectives are
  // compared while the optimizer steps, and checked before the update is used
  // (Note [FSDP's step check]).
  step_check_->verify();  // a backward that issued no collective never checked the forward's
  step_check_->launch(iteration_);
}

torch::Tensor FullyShardedDataParallel::reduce_grad_norm(const torch::Tensor& local, double norm_type) {
  if (!shard_group_ || shard_group_->size() == 1) return local;
  // Gradients are identical across replicas (HYBRID_SHARD), so the shard group holds each element once.
  torch::NoGradGuard no_grad;
  if (std::isinf(norm_type)) {
    torch::Tensor value = local.detach().to(torch::kFloat).reshape({1}).clone();
    shard_group_->all_reduce(value, ReduceOp::kMax);
    return value.reshape({});
  }
  torch::Tensor value = local.detach().to(torch::kFloat).pow(norm_type).reshape({1});
  shard_group_->all_reduce(value, ReduceOp::kSum);
  return value.pow(1.0 / norm_type).reshape({});
}

torch::Tensor FullyShardedDataParallel::any_rank_true(const torch::Tensor& local) {
  if (group_->size() == 1) return local;
  torch::Tensor value = local.clone();
  group_->all_reduce(value, ReduceOp::kMax);
  return value;
}

void FullyShardedDataParallel::shards_changed() {
  for (auto& unit : units_) unit->mark_shard_updated();
  refresh_persistent_units();
}

void FullyShardedDataParallel::step_failed(const std::exception_ptr& error, bool reduced, bool /*sync*/,
                                           int64_t iteration) {
  if (broken_.empty()) {
    broken_ = str_cat("FSDP on rank ", group_->global_rank(group_->rank()), ": the step of iteration ", iteration,
                      " failed ", reduced ? "after its gradients were reduced" : "before its gradients were reduced",
                      " (", describe_exception(error), "). A sharded step cannot be dropped on every rank: the others "
                      "are inside its all-gathers and reduce-scatters (they wait until this process exits or their "
                      "collectives time out), and each rank's shards move on with its own step. This model cannot "
                      "train on in this process: restart from the last checkpoint (lockstep train --resume).");
  }
  reset_backward_state();
  throw Error(broken_);
}

void FullyShardedDataParallel::after_step() {
  step_check_->verify();
  shards_changed();
  if (optimizer_) {
    // Counting may serialise the state (optimizer types without a typed
    // codec), so only when it gained or lost parameters: optimizers create a
    // parameter's buffers together, on its first step.
    const std::pair<const void*, size_t> counted{optimizer_.get(), optimizer_->state().size()};
    if (counted != optimizer_counted_) {
      memory_.optimizer = optimizer_state_bytes(*optimizer_);
      optimizer_counted_ = counted;
    }
  }
  sample_memory();
}

// --- backward --------------------------------------------------------------

void FullyShardedDataParallel::begin_backward_pass() {
  LOCKSTEP_ASSERT(!in_backward(), "FSDP backward pass begun twice");
  step_check_->verify();  // before this backward pairs a collective with another rank's
  enter(phase_ == Phase::kPlanned ? Phase::kBackward : Phase::kUnplannedBackward);
  compat::queue_backward_callback([this] { finish_backward_pass(); });
}

void FullyShardedDataParallel::pre_backward(int unit) {
  if (!in_backward()) begin_backward_pass();
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  if (run.pre_backward_done) return;
  run.pre_backward_done = true;
  if (!backward_seen_ && std::find(backward_order_.begin(), backward_order_.end(), unit) == backward_order_.end()) {
    backward_order_.push_back(unit);
  }
  ensure_gathered(*units_[static_cast<size_t>(unit)]);
  if (options_.backward_prefetch() == BackwardPrefetch::kPre) prefetch(next_in_backward(unit));
  sample_memory();
}

void FullyShardedDataParallel::on_grad_ready(int unit, size_t slot) {
  if (!in_backward()) begin_backward_pass();
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  if (!run.entered_ever && !units_[static_cast<size_t>(unit)]->persistent()) check_interception();
  if (run.slot_ready[slot]) return;
  run.slot_ready[slot] = 1;
  run.ready_grads += 1;
  if (!options_.accumulate_unsharded() || sync_) units_[static_cast<size_t>(unit)]->absorb_grad(slot);
  const int expected = phase_ == Phase::kBackward ? run.expected_grads : static_cast<int>(run.slot_ready.size());
  if (run.ready_grads >= expected && !run.post_backward_done) post_backward(unit);
}

void FullyShardedDataParallel::post_backward(int unit) {
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  run.post_backward_done = true;
  auto& flat = *units_[static_cast<size_t>(unit)];
  // Backward is done with the parameters: they go before the reduction's
  // buffers are allocated.
  flat.reshard();
  if (!options_.accumulate_unsharded() || sync_) {
    flat.start_reduce();
    reducing_.push_back(unit);
    sample_memory();
    const size_t in_flight = options_.overlap_reductions() ? kMaxReductionsInFlight : 0;
    while (reducing_.size() > in_flight) finish_oldest_reduction();
  }
  if (options_.backward_prefetch() == BackwardPrefetch::kPost) prefetch(next_in_backward(unit));
  sample_memory();
}

void FullyShardedDataParallel::finish_oldest_reduction() {
  const int unit = reducing_.front();
  reducing_.erase(reducing_.begin());
  units_[static_cast<size_t>(unit)]->finish_reduce();
}

void FullyShardedDataParallel::finish_backward_pass() {
  // Units whose parameters got some but not all of their gradients (used on
  // this rank in ways begin_backward could not see) reduce what they have,
  // in unit order.
  for (const auto& unit : units_) {
    UnitRun& run = runs_[static_cast<size_t>(unit->index())];
    if (!run.post_backward_done && run.ready_grads > 0) post_backward(unit->index());
  }
  sample_memory();
  while (!reducing_.empty()) finish_oldest_reduction();
  // Offloaded gradients are read by the optimizer on the host: one wait for
  // all of their copies (the device syncs once per backward, as PyTorch's FSDP).
  for (auto& unit : units_) unit->wait_for_host_copies();
  for (auto& unit : units_) unit->reshard();
  backward_seen_ = true;
  reset_backward_state();
  sample_memory();
}

void FullyShardedDataParallel::reset_backward_state() {
  for (auto& run : runs_) {
    run.pre_backward_done = run.post_backward_done = false;
    run.ready_grads = 0;
    std::fill(run.slot_ready.begin(), run.slot_ready.end(), 0);
  }
  enter(Phase::kIdle);
}

void FullyShardedDataParallel::enter(Phase next) {
  constexpr unsigned kMayComeFrom[] = {
      kFromAny,                                                 // kIdle
      phase_bit(Phase::kIdle) | phase_bit(Phase::kPlanned),     // kPlanned
      kFromAny & ~phase_bit(Phase::kIdle),                      // kBackward
      phase_bit(Phase::kIdle)};                                 // kUnplannedBackward
  constexpr const char* kNames[] = {"idle", "a planned backward", "a backward", "an unplanned backward"};
  move_phase("FSDP", phase_, next, kMayComeFrom, kNames);
}

// --- parameters, memory ----------------------------------------------------

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::named_shard_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& unit : units_) {
    named.emplace_back(unit->path().empty() ? "flat_param" : unit->path() + ".flat_param", unit->shard());
  }
  return named;
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::named_orig_parameters() const {
  LOCKSTEP_CHECK(options_.use_orig_params(), "FSDP: named_orig_parameters() needs FSDPOptions().use_orig_params(true) "
                 "(model_wrapper.use_orig_params: true)");
  std::vector<std::pair<int64_t, std::pair<std::string, torch::Tensor>>> by_model_index;
  for (const auto& unit : units_) {
    for (size_t s = 0; s < unit->slots().size(); ++s) {
      const auto& slot = unit->slots()[s];
      by_model_index.push_back({slot.model_index, {slot.name, unit->orig_params()[s]}});
    }
  }
  std::sort(by_model_index.begin(), by_model_index.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& entry : by_model_index) named.push_back(std::move(entry.second));
  return named;
}

std::vector<torch::Tensor> FullyShardedDataParallel::shard_parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& unit : units_) params.push_back(unit->shard());
  return params;
}

void FullyShardedDataParallel::track_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer) {
  optimizer_ = std::move(optimizer);
}

void FullyShardedDataParallel::sample_memory() {
  int64_t params = 0;
  int64_t grads = 0;
  for (const auto& unit : units_) {
    params += unit->shard().numel() * unit->shard().element_size() + unit->gathered_bytes();
    grads += unit->gradient_bytes();
  }
  for (const auto& [name, param] : frozen_) params += param.numel() * param.element_size();
  memory_.params = params;
  memory_.grads = grads;
  memory_.peak_params = std::max(memory_.peak_params, params);
  memory_.peak_grads = std::max(memory_.peak_grads, grads);
  memory_.peak_optimizer = std::max(memory_.peak_optimizer, memory_.optimizer);
  memory_.peak_total = std::max(memory_.peak_total, params + grads + memory_.optimizer);
}

void FullyShardedDataParallel::reset_peak_stats() {
  memory_.peak_params = memory_.peak_grads = memory_.peak_optimizer = memory_.peak_total = 0;
  max_gathered_ = gathered_units();
  sample_memory();
}

// --- summon_full_params ----------------------------------------------------

FullyShardedDataParallel::FullParams::FullParams(FullyShardedDataParallel* fsdp, bool writeback)
    : fsdp_(fsdp), writeback_(writeback) {
  LOCKSTEP_CHECK(!fsdp_->in_backward(), "summon_full_params during backward");
  for (auto& unit : fsdp_->units_) {
    if (unit->state() == fsdp::FlatParamUnit::State::kGathering) unit->finish_gather();
    flats_.push_back(unit->gather_full_precision());
    unit->point_params_at(flats_.back());
  }
}

FullyShardedDataParallel::FullParams::~FullParams() {
  try {
    for (auto& unit : fsdp_->units_) {
      if (writeback_) unit->load_flat(flats_[static_cast<size_t>(unit->index())]);
      unit->restore_param_views();
    }
    // Units that stay gathered see the written-back shards (collective; every rank does it).
    if (writeback_) fsdp_->refresh_persistent_units();
  } catch (const std::exception& error) {
    logger().error("summon_full_params: {}", error.what());
  }
}

std::unique_ptr<FullyShardedDataParallel::FullParams> FullyShardedDataParallel::summon_full_params(bool writeback) {
  return std::unique_ptr<FullParams>(new FullParams(this, writeback));
}

}  // namespace lockstep
