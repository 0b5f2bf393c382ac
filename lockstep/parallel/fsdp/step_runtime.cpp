// fsdp::StepRuntime: the per-iteration life cycle of the units (the diagram
// is in internal/step_runtime.h).
#include "lockstep/parallel/fsdp/internal/step_runtime.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <unordered_set>

#include "lockstep/compat/autograd.h"
#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/model/activation_checkpoint.h"
#include "lockstep/model/batch.h"

namespace lockstep::fsdp {
namespace {
// Reductions left in flight while the next unit's backward runs: each holds
// a unit-sized flat gradient, so one overlaps communication with computation
// and keeps the unsharded gradients at two units (this one's, the next one's).
constexpr size_t kMaxReductionsInFlight = 1;
}  // namespace

StepRuntime::StepRuntime(const ShardedModel& model, StepCheck& step_check, MemoryMeter& meter)
    : model_(model), step_check_(step_check), meter_(meter) {}

StepRuntime::~StepRuntime() { detail::unregister_units(this); }

void StepRuntime::units_built() {
  for (const auto& unit : model_.units) {
    UnitRun run;
    run.slot_ready.assign(unit->slots().size(), 0);
    run.slot_in_graph.assign(unit->slots().size(), 1);
    for (const auto& slot : unit->slots()) run.trainable_slots += slot.trainable ? 1 : 0;
    // Its companions hold frozen parameters too (Note [A unit of several dtypes]).
    run.holds_frozen = run.trainable_slots < static_cast<int>(unit->slots().size()) ||
                       !model_.companions[static_cast<size_t>(unit->index())].empty();
    runs_.push_back(std::move(run));
    if (!unit->path().empty() && !model_.is_companion(unit->index())) {
      detail::register_unit(unit->module(), this, unit->index());
    }
  }
}

// --- forward ---------------------------------------------------------------

void StepRuntime::enter_unit(int unit) {
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  if (run.depth > 0) {  // a Sequential entry whose module opens its own scope too
    ++run.depth;
    return;
  }
  throw_pending_error();
  LOCKSTEP_CHECK(!in_backward(), "FSDP: unit '", model_.units[static_cast<size_t>(unit)]->path(),
                 "' ran forward during a backward pass: an activation checkpoint must sit inside the unit's scope "
                 "(lockstep::checkpointed() between unit_scope() and scope.output()), not around whole units");
  if (!backward_seen_ &&
      std::find(order_.forward.begin(), order_.forward.end(), unit) == order_.forward.end()) {
    order_.forward.push_back(unit);
  }
  for (int part : model_.parts_of(unit)) model_.unit(part).mark_intercepted();
  ensure_gathered(unit);
  if (model_.options.forward_prefetch()) prefetch(next_in_forward(unit));
  run.entered_ever = true;
  run.output_registered = false;
  run.depth = 1;
  meter_.sample();
}

void StepRuntime::leave_unit(int unit) noexcept {
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  if (--run.depth > 0) return;
  const auto& flat = model_.unit(unit);
  const bool unwinding = std::uncaught_exceptions() > 0;
  const bool grad = torch::GradMode::is_enabled();
  try {
    if (grad && !run.output_registered && !unwinding && pending_error_.empty()) {
      pending_error_ = "FSDP: the forward of unit '" + flat.path() + "' (" + flat.module()->name() +
                       ") opened lockstep::fsdp::unit_scope but returned without passing its result through "
                       "scope.output(y): its backward would find the parameters freed. Return scope.output(y).";
    }
    const bool free_after_forward = model_.options.sharding_strategy() == ShardingStrategy::kFullShard ||
                                    model_.options.sharding_strategy() == ShardingStrategy::kHybridShard;
    for (int part : model_.parts_of(unit)) {
      if (!grad || unwinding) {
        model_.unit(part).reshard();
      } else if (free_after_forward) {
        model_.unit(part).reshard_after_forward();
      }
    }
    meter_.sample();
  } catch (const std::exception& error) {
    if (pending_error_.empty()) {
      pending_error_ = std::string("FSDP: freeing unit '") + flat.path() + "' failed: " + error.what();
    }
  }
}

// Note [A unit with frozen parameters]
// A unit's backward is done, for FSDP1, when every parameter it holds has its
// gradient: the node that computes a weight's gradient also computes its
// input's, so no later node reads the weights. A frozen parameter
// (FullyShard) has no gradient to wait for, and its node may run after every
// trainable gradient is in: LoRA's adapter beside a frozen linear finishes
// first, and freeing the unit then would pull the frozen weight from under
// the node that still multiplies by it. So a unit that holds a frozen
// parameter ends its backward when the gradients of its marked inputs
// (UnitScope::input, every Sequential entry's input) have all arrived -- the
// whole unit's backward lies between its outputs and its inputs, as PyTorch's
// fully_shard reasons with RegisterPostBackwardFunction -- or, with none
// marked or none needing a gradient, when the whole backward ends.
void StepRuntime::register_input(int unit, const torch::Tensor& input) {
  if (!input.defined() || !input.requires_grad() || !torch::GradMode::is_enabled()) return;
  runs_[static_cast<size_t>(unit)].inputs_waiting += 1;
  torch::Tensor hooked = input;
  hooked.register_hook([this, unit](const torch::Tensor&) { input_grad_ready(unit); });
}

void StepRuntime::input_grad_ready(int unit) {
  if (!in_backward()) begin_backward_pass();
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  if (run.inputs_waiting > 0) run.inputs_waiting -= 1;
  if (run.inputs_waiting > 0 || !run.holds_frozen || run.post_backward_done || !run.pre_backward_done) return;
  post_backward(unit);
}

// The hook goes on the output as the unit computed it and the cast comes
// after, as fully_shard's _post_forward registers its pre-backward hook and
// then applies output_dtype.
torch::Tensor StepRuntime::register_output(int unit, const torch::Tensor& output) {
  runs_[static_cast<size_t>(unit)].output_registered = true;
  if (output.defined() && output.requires_grad() && torch::GradMode::is_enabled()) {
    torch::Tensor hooked = output;
    hooked.register_hook([this, unit](const torch::Tensor&) { pre_backward(unit); });
  }
  return cast_floating(output, model_.options.mixed_precision().output_dtype());
}

void StepRuntime::ensure_gathered(int unit) {
  const std::vector<int> parts = model_.parts_of(unit);
  for (int part : parts) {
    if (model_.unit(part).state() == FlatParamUnit::State::kSharded) model_.unit(part).start_gather();
  }
  for (int part : parts) {
    model_.unit(part).finish_gather();
    model_.unit(part).refresh();  // gathered since wrapping, and the shard was loaded or stepped since
  }
  meter_.note_gathered(gathered_units());
}

int StepRuntime::gathered_units() const {
  int count = 0;
  for (const auto& unit : model_.units) {
    if (model_.is_companion(unit->index())) continue;  // gathered with its leader, counted once
    if (!unit->setup().persistent && !unit->aliases_shard() && unit->state() != FlatParamUnit::State::kSharded) ++count;
  }
  return count;
}

void StepRuntime::prefetch(int unit) {
  if (unit < 0) return;
  if (model_.unit(unit).state() != FlatParamUnit::State::kSharded) return;
  if (model_.options.limit_all_gathers() > 0 && gathered_units() >= model_.options.limit_all_gathers()) return;
  for (int part : model_.parts_of(unit)) {
    if (model_.unit(part).state() == FlatParamUnit::State::kSharded) model_.unit(part).start_gather();
  }
  meter_.note_gathered(gathered_units());
}

int StepRuntime::next_in_forward(int unit) const {
  if (!backward_seen_) return -1;  // the order is known after the first iteration
  auto it = std::find(order_.forward.begin(), order_.forward.end(), unit);
  if (it == order_.forward.end() || it + 1 == order_.forward.end()) return -1;
  return *(it + 1);
}

int StepRuntime::next_in_backward(int unit) const {
  // Before the first backward has finished, the reverse forward order is the best guess.
  if (!backward_seen_) {
    auto it = std::find(order_.forward.rbegin(), order_.forward.rend(), unit);
    if (it == order_.forward.rend() || it + 1 == order_.forward.rend()) return -1;
    return *(it + 1);
  }
  auto it = std::find(order_.backward.begin(), order_.backward.end(), unit);
  if (it == order_.backward.end() || it + 1 == order_.backward.end()) return -1;
  return *(it + 1);
}

void StepRuntime::refresh_persistent_units() {
  for (auto& unit : model_.units) {
    if (unit->setup().persistent) unit->refresh();
  }
}

void StepRuntime::throw_pending_error() {
  LOCKSTEP_CHECK(broken_.empty(), broken_);
  if (pending_error_.empty()) return;
  std::string message = std::move(pending_error_);
  pending_error_.clear();
  throw Error(message);
}

// --- what GradientSync asks -----------------------------------------------

void StepRuntime::begin_forward(bool sync) {
  throw_pending_error();
  step_check_.verify();
  sync_ = sync;
  refresh_persistent_units();
  // use_orig_params: a gradient zero_grad dropped from every view is freed now, not at the next reduction.
  for (auto& unit : model_.units) unit->gradients().collect_orig_grads();
}

void StepRuntime::begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration) {
  throw_pending_error();
  check_interception();
  sync_ = sync;
  iteration_ = iteration;
  // The forward's unit collectives are compared while backward computes its
  // first layers; checked before backward issues any collective of its own
  // (Note [FSDP's step check]).
  step_check_.launch(iteration_);
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
  for (const auto& unit : model_.units) {
    UnitRun& run = runs_[static_cast<size_t>(unit->index())];
    run.expected_grads = 0;
    for (size_t s = 0; s < unit->slots().size(); ++s) {
      const auto& hook = unit->hooks()[s];  // null: frozen, never waited for
      const bool in_graph = hook && (hidden || graph.count(hook->accumulator()) > 0);
      run.slot_in_graph[s] = in_graph ? 1 : 0;
      run.expected_grads += in_graph ? 1 : 0;
    }
  }
  // A backward already running (its hooks fired before this call) keeps running, now planned.
  enter(in_backward() ? Phase::kBackward : Phase::kPlanned);
}

void StepRuntime::end_backward() {
  if (in_backward()) {
    finish_backward_pass();  // autograd never ran the final callback (no hook fired after it was queued)
  } else {
    // A backward that reached none of FSDP's parameters: only clean up.
    for (auto& unit : model_.units) unit->reshard();
    reset_backward_state();
  }
  // Every rank ends each backward here: the backward's unit collectives are
  // compared while the optimizer steps, and checked before the update is used
  // (Note [FSDP's step check]).
  step_check_.verify();  // a backward that issued no collective never checked the forward's
  step_check_.launch(iteration_);
}

void StepRuntime::shards_changed() {
  for (auto& unit : model_.units) unit->mark_shard_updated();
  refresh_persistent_units();
}

void StepRuntime::step_failed(const std::exception_ptr& error, bool reduced, int64_t iteration) {
  if (broken_.empty()) {
    broken_ =
        str_cat("FSDP on rank ", model_.group->global_rank(model_.group->rank()), ": the step of iteration ", iteration,
                " failed ", reduced ? "after its gradients were reduced" : "before its gradients were reduced", " (",
                describe_exception(error),
                "). A sharded step cannot be dropped on every rank: the others "
                "are inside its all-gathers and reduce-scatters (they wait until this process exits or their "
                "collectives time out), and each rank's shards move on with its own step. This model cannot "
                "train on in this process: restart from the last checkpoint (lockstep train --resume).");
  }
  reset_backward_state();
  throw Error(broken_);
}

void StepRuntime::after_step() {
  step_check_.verify();
  shards_changed();
  meter_.count_optimizer();
  meter_.sample();
}

// --- backward --------------------------------------------------------------

void StepRuntime::begin_backward_pass() {
  LOCKSTEP_ASSERT(!in_backward(), "FSDP backward pass begun twice");
  step_check_.verify();  // before this backward pairs a collective with another rank's
  enter(phase_ == Phase::kPlanned ? Phase::kBackward : Phase::kUnplannedBackward);
  compat::queue_backward_callback([this] { finish_backward_pass(); });
}

void StepRuntime::pre_backward(int unit) {
  if (!in_backward()) begin_backward_pass();
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  if (run.pre_backward_done) return;
  run.pre_backward_done = true;
  if (!backward_seen_ && std::find(order_.backward.begin(), order_.backward.end(), unit) == order_.backward.end()) {
    order_.backward.push_back(unit);
  }
  ensure_gathered(unit);
  if (model_.options.backward_prefetch() == BackwardPrefetch::kPre) prefetch(next_in_backward(unit));
  meter_.sample();
}

void StepRuntime::on_grad_ready(int unit, size_t slot) {
  if (!in_backward()) begin_backward_pass();
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  if (!run.entered_ever && !model_.units[static_cast<size_t>(unit)]->setup().persistent) check_interception();
  if (run.slot_ready[slot]) return;
  run.slot_ready[slot] = 1;
  run.ready_grads += 1;
  if (!model_.options.accumulate_unsharded() || sync_) model_.unit(unit).gradients().absorb(slot);
  const int expected = phase_ == Phase::kBackward ? run.expected_grads : run.trainable_slots;
  // Note [A unit with frozen parameters]: such a unit waits for its inputs' gradients.
  if (run.ready_grads >= expected && !run.post_backward_done && !run.holds_frozen) post_backward(unit);
}

void StepRuntime::post_backward(int unit) {
  UnitRun& run = runs_[static_cast<size_t>(unit)];
  run.post_backward_done = true;
  auto& flat = model_.unit(unit);
  // Backward is done with the parameters: they go before the reduction's
  // buffers are allocated.
  for (int part : model_.parts_of(unit)) model_.unit(part).reshard();
  if (!model_.options.accumulate_unsharded() || sync_) {
    flat.gradients().start_reduce();
    reducing_.push_back(unit);
    meter_.sample();
    const size_t in_flight = model_.options.overlap_reductions() ? kMaxReductionsInFlight : 0;
    while (reducing_.size() > in_flight) finish_oldest_reduction();
  }
  if (model_.options.backward_prefetch() == BackwardPrefetch::kPost) prefetch(next_in_backward(unit));
  meter_.sample();
}

void StepRuntime::finish_oldest_reduction() {
  const int unit = reducing_.front();
  reducing_.erase(reducing_.begin());
  model_.unit(unit).gradients().finish_reduce();
}

void StepRuntime::finish_backward_pass() {
  // Units whose parameters got some but not all of their gradients (used on
  // this rank in ways begin_backward could not see) reduce what they have,
  // in unit order.
  for (const auto& unit : model_.units) {
    UnitRun& run = runs_[static_cast<size_t>(unit->index())];
    if (!run.post_backward_done && run.ready_grads > 0) post_backward(unit->index());
  }
  meter_.sample();
  while (!reducing_.empty()) finish_oldest_reduction();
  // Offloaded gradients are read by the optimizer on the host: one wait for
  // all of their copies (the device syncs once per backward, as PyTorch's FSDP).
  for (auto& unit : model_.units) unit->gradients().wait_for_host_copies();
  for (auto& unit : model_.units) unit->reshard();
  backward_seen_ = true;
  reset_backward_state();
  meter_.sample();
}

void StepRuntime::reset_backward_state() {
  for (auto& run : runs_) {
    run.pre_backward_done = run.post_backward_done = false;
    run.ready_grads = 0;
    run.inputs_waiting = 0;
    std::fill(run.slot_ready.begin(), run.slot_ready.end(), 0);
  }
  enter(Phase::kIdle);
}

void StepRuntime::enter(Phase next) {
  constexpr unsigned kMayComeFrom[] = {
      kFromAny,                                                 // kIdle
      phase_bit(Phase::kIdle) | phase_bit(Phase::kPlanned),     // kPlanned
      kFromAny & ~phase_bit(Phase::kIdle),                      // kBackward
      phase_bit(Phase::kIdle)};                                 // kUnplannedBackward
  constexpr const char* kNames[] = {"idle", "a planned backward", "a backward", "an unplanned backward"};
  move_phase("FSDP", phase_, next, kMayComeFrom, kNames);
}

void StepRuntime::check_interception() const {
  std::vector<std::string> missing;
  for (const auto& unit : model_.units) {
    if (!unit->path().empty() && !unit->setup().persistent && !model_.is_companion(unit->index()) &&
        !runs_[static_cast<size_t>(unit->index())].entered_ever) {
      missing.push_back(unit->path() + " (" + unit->module()->name() + ")");
    }
  }
  if (missing.empty()) return;
  std::string list;
  for (const auto& entry : missing) list += "\n  " + entry;
  LOCKSTEP_FAIL("FSDP on rank ", model_.group->global_rank(model_.group->rank()),
                ": the forward pass did not go through ", missing.size(), " unit(s) the wrap policy chose:", list,
                "\nFSDP cannot see a module's forward by itself (libtorch has no forward hooks), and these "
                "parameters would go stale. Either put the module in a torch::nn::Sequential (FSDP intercepts "
                "its entries), or open `auto scope = lockstep::fsdp::unit_scope(*this);` in its forward and "
                "return `scope.output(y)`. If the module is simply unused, change the wrap policy so it is no unit.");
}

}  // namespace lockstep::fsdp
