// fsdp::StepRuntime: FullyShardedDataParallel's per-iteration life cycle of
// the units, the state machine PyTorch's FSDP calls its TrainingState.
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
//             Note [The root unit] in unit_builder.cpp)
//
// unit_scope() reaches it as the units' fsdp::detail::UnitRuntime; the
// OptimWrapper reaches it through FullyShardedDataParallel's GradientSync.
//
//   fsdp::StepRuntime runtime(model, step_check, meter);
//   fsdp::UnitBuilder builder(model, &step_check,
//                             [&runtime](int unit, size_t slot) { runtime.on_grad_ready(unit, slot); });
//   builder.build();
//   runtime.units_built();  // registers the units for unit_scope
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"
#include "lockstep/parallel/fsdp/internal/memory_meter.h"
#include "lockstep/parallel/fsdp/internal/sharded_model.h"
#include "lockstep/parallel/fsdp/unit_scope.h"

namespace lockstep::fsdp {

class StepRuntime : public detail::UnitRuntime {
 public:
  StepRuntime(const ShardedModel& model, StepCheck& step_check, MemoryMeter& meter);
  ~StepRuntime() override;  // held where it was made: the units' hooks point at it

  // After UnitBuilder::build: per-unit progress, and unit_scope finds the units.
  void units_built();

  // --- what GradientSync asks of FSDP (fully_sharded_data_parallel.h) -------
  void begin_forward(bool sync);
  void begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration);
  void end_backward();
  void after_step();
  [[noreturn]] void step_failed(const std::exception_ptr& error, bool reduced, int64_t iteration);
  // The shards were written (a step, a load, an EMA swap): gathered copies are refreshed.
  void shards_changed();

  // --- the hooks ------------------------------------------------------------
  void enter_unit(int unit) override;
  void leave_unit(int unit) noexcept override;
  torch::Tensor register_output(int unit, const torch::Tensor& output) override;
  void register_input(int unit, const torch::Tensor& input) override;
  void on_grad_ready(int unit, size_t slot);

  bool in_backward() const { return phase_ == Phase::kBackward || phase_ == Phase::kUnplannedBackward; }
  // Re-gathers the units that are never freed (collective).
  void refresh_persistent_units();
  // Units gathered now (those never freed excluded).
  int gathered_units() const;
  const ExecutionOrder& execution_order() const { return order_; }

 private:
  // Gathering.
  // Gathers `unit` and its companions (Note [A unit of several dtypes]), waiting for a prefetch.
  void ensure_gathered(int unit);
  void prefetch(int unit);
  int next_in_forward(int unit) const;
  int next_in_backward(int unit) const;
  void throw_pending_error();
  void check_interception() const;

  // The backward.
  void pre_backward(int unit);
  // A marked input of `unit` got its gradient (Note [A unit with frozen parameters]).
  void input_grad_ready(int unit);
  void post_backward(int unit);
  void begin_backward_pass();
  void finish_backward_pass();
  void finish_oldest_reduction();

  struct UnitRun {
    bool entered_ever = false;      // intercepted at least once
    int depth = 0;                  // open scopes
    bool output_registered = false; // in the current forward
    bool pre_backward_done = false;
    bool post_backward_done = false;
    int expected_grads = 0;
    int ready_grads = 0;
    int trainable_slots = 0;        // the gradients an unplanned backward waits for
    bool holds_frozen = false;      // ends its backward by its inputs' gradients (Note [A unit with frozen parameters])
    int inputs_waiting = 0;         // inputs marked in this forward whose gradients have not arrived
    std::vector<char> slot_ready;
    std::vector<char> slot_in_graph;
  };

  // Where FSDP is in a step's backward. Every transition goes through
  // enter(), which asserts it is an edge of this machine:
  //   kIdle --begin_backward--> kPlanned --first hook--> kBackward
  //   kIdle --first hook (no begin_backward)--> kUnplannedBackward
  //   kPlanned --begin_backward--> kPlanned (a planned loss whose backward never ran)
  //   kBackward | kUnplannedBackward --begin_backward--> kBackward (hooks fired before the plan)
  //   any --finish_backward_pass / end_backward--> kIdle (reset_backward_state)
  enum class Phase {
    kIdle,
    kPlanned,            // begin_backward computed which slots this loss reaches
    kBackward,           // hooks are firing; units complete when their reached slots are ready
    kUnplannedBackward,  // hooks are firing for a backward begin_backward never saw: every slot counts
  };
  // Moves to `next`, asserting the diagram above has that edge.
  void enter(Phase next);
  // Clears every unit's per-backward progress and returns to kIdle: the one reset.
  void reset_backward_state();

  const ShardedModel& model_;
  StepCheck& step_check_;  // ranks ran the same step and units (Note [FSDP's step check])
  MemoryMeter& meter_;
  std::vector<UnitRun> runs_;
  Phase phase_ = Phase::kIdle;
  bool sync_ = true;
  int64_t iteration_ = 0;      // of the current backward, for the step check
  bool backward_seen_ = false;  // the first backward has finished: orders are fixed
  ExecutionOrder order_;
  std::vector<int> reducing_;  // units with a reduction in flight, oldest first
  std::string pending_error_;
  std::string broken_;  // set by step_failed: why no step can run any more
};

}  // namespace lockstep::fsdp
