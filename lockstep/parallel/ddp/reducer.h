// Reducer: DDP's gradient machinery. Buckets, per-parameter autograd hooks,
// in-order asynchronous launches overlapped with backward, and the final
// callback that waits and writes the averaged gradients back.
//
// What PyTorch's C++ reducer does, rebuilt on lockstep's ProcessGroup:
//   - gradients are copied, divided by the world size (Note [Dividing by the world size]),
//     into flat buckets as soon as autograd has accumulated them; a full
//     bucket is launched at once, strictly in bucket order on every rank;
//   - the first iteration's buckets are PyTorch's (bucket_assignment.h:
//     initial_buckets), then they are rebuilt once, before the second
//     forward, in the order gradients actually became ready (rank 0's order,
//     broadcast, so every rank agrees; Note [Bucket order and rebuild]);
//   - find_unused_parameters marks parameters outside the loss's graph ready
//     up front, and parameters unused on every rank get no gradient (the
//     optimizer skips them, with or without gradient_as_bucket_view;
//     Note [Unused parameters get no gradient]);
//   - static_graph learns, in its first iteration, how often each hook fires
//     and which parameters are unused, and then needs no graph traversal;
//   - gradient_as_bucket_view makes .grad alias the bucket (no copies;
//     Note [Gradients as bucket views]);
//   - every synchronised backward also exchanges the iteration it belongs to,
//     so a rank that skipped a step is named instead of silently averaging
//     gradients of different iterations. It goes out when backward starts,
//     ahead of the buckets, and is done long before the end of backward: no
//     round trip of its own. Only when a used map must be exchanged too
//     (find_unused_parameters, a static graph's first pass) does it wait for
//     the end of backward, as PyTorch's used-map all_reduce does
//     (Note [The iteration check]);
//   - a comm hook (comm_hook.h) reduces each bucket when one is registered;
//     without one the copy into the bucket divides and the bucket is summed;
//   - every synchronised backward ends with the ranks agreeing that each of
//     them completed it: a rank whose backward failed (an exception in
//     autograd, parameters left without gradients) still completes the
//     pass's collectives, with zeros, so every rank drops the step together
//     and can go on (Note [Dropping a failed step]).
//
// The Notes named above are in reducer.cpp, but for the buckets' (in
// reducer_buckets.cpp) and Note [The iteration check] (iteration_check.cpp).
//
// Used through DistributedDataParallel; see distributed_data_parallel.h.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/torch.h>

#include "lockstep/parallel/ddp/comm_hook.h"

namespace lockstep {

namespace detail {
class IterationCheck;
}

class ProcessGroup;
namespace compat {
class PostAccumulateHook;
}

struct ReducerOptions {
  TORCH_ARG(int64_t, first_bucket_bytes) = int64_t{1} << 20;
  TORCH_ARG(int64_t, bucket_bytes) = int64_t{25} << 20;
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  TORCH_ARG(bool, find_unused_parameters) = false;
  TORCH_ARG(bool, static_graph) = false;
};

// When the last synchronised backward launched each bucket, relative to the
// end of backward: the proof that communication overlapped computation.
struct ReductionTimeline {
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> bucket_launched;  // by bucket index
  Clock::time_point check_launched;                 // the iteration check (Note [The iteration check])
  Clock::time_point last_hook;                      // the last gradient hook of the pass
  Clock::time_point backward_finished;              // the final callback began
};

class Reducer {
 public:
  Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> group,
          ReducerOptions options);
  ~Reducer();
  C10_DISABLE_COPY_AND_ASSIGN(Reducer);

  void set_comm_hook(std::shared_ptr<CommHook> hook);
  // The registered hook; null when DDP reduces without one.
  std::shared_ptr<CommHook> comm_hook() const;
  // A forward pass is about to run: the one-time bucket rebuild happens here,
  // before activations fill memory (collective on the first call after the
  // first synchronised backward; later calls do nothing). See Note [Bucket order and rebuild].
  void prepare_for_forward();
  // Inside DDP's no_sync(): gradients may accumulate locally without a
  // prepare_for_backward. Outside it, a gradient that arrives while the
  // reducer is not armed is an error (see autograd_hook).
  void set_local_accumulation_allowed(bool allowed);
  // Arms the hooks for one backward pass from `loss`. With sync false the
  // gradients only accumulate locally (no_sync): nothing is communicated.
  // `iteration` must be the same on every rank (it is checked: Note [The iteration check]).
  void prepare_for_backward(const torch::Tensor& loss, bool sync, int64_t iteration);
  // After loss.backward() returned: completes the reduction if no hook ran
  // (so the final callback was never queued) and reports a backward that
  // left parameters without gradients.
  void finish_backward();

  // This rank's step failed with `error` before its gradients were reduced
  // (Note [Dropping a failed step]). With a synchronised pass in flight, or
  // with `start_pass` (the step failed before its backward began, after a
  // synchronised forward), this rank completes the pass's collectives with
  // zero gradients and throws the error every rank then throws: "... dropped
  // on every rank: rank r failed: <reason>". Returns (nothing to abandon) when
  // no pass is in flight and `start_pass` is false, or when this iteration's
  // pass already ended in such an agreement.
  void abandon(const std::exception_ptr& error, bool start_pass, int64_t iteration);
  // This rank failed after the gradients of `iteration` were reduced (its
  // optimizer step did not complete), so its weights may differ from the
  // others': the next synchronised backward tells every rank, and every rank
  // fails there naming it.
  void mark_diverged(int64_t iteration, const std::string& reason);

  std::vector<std::vector<size_t>> bucket_indices() const;
  // The order the buckets were rebuilt in (empty until they are), and a way
  // back to it after a restart: a resumed run then sums gradients in the
  // same order as the uninterrupted one. Local; every rank passes the same.
  // See Note [Bucket order and rebuild].
  std::vector<int64_t> rebuilt_order() const;
  void restore_rebuilt_order(const std::vector<int64_t>& order);
  bool buckets_rebuilt() const { return rebuilt_; }
  ReductionTimeline last_timeline() const;

 private:
  struct Bucket {
    torch::Tensor flat;
    std::vector<size_t> variables;
    std::vector<torch::Tensor> views;  // shaped like each variable, into `flat`
    size_t pending = 0;
    std::unique_ptr<PendingReduction> reduction;
  };
  struct Location {
    size_t bucket = 0;
    size_t slot = 0;
  };

  void build_buckets(const std::vector<size_t>& order);
  void build_buckets_from(const std::vector<std::vector<size_t>>& assignment);
  void rebuild_buckets_from_rank0();
  void autograd_hook(size_t index);
  void mark_variable_ready(size_t index);
  void launch_ready_buckets();
  void finalize_backward();
  // Starts a synchronised pass (the state prepare_for_backward sets up).
  void start_pass(int64_t iteration);
  // Completes this pass's collectives with zeros for every parameter not
  // ready yet, agrees with every rank that it failed, drops the gradients and
  // throws the agreed error. Requires mutex_ and a pass in flight.
  [[noreturn]] void abandon_pass(const std::exception_ptr& error);
  // After an agreement that the pass failed: no rank keeps its gradients.
  void drop_gradients();

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> group_;
  ReducerOptions options_;
  std::shared_ptr<CommHook> comm_hook_;  // null: divide while copying, then all_reduce
  std::vector<std::unique_ptr<compat::PostAccumulateHook>> hooks_;
  std::vector<Bucket> buckets_;
  std::vector<Location> locations_;

  // Where the reducer is in a step. Every transition goes through enter(),
  // which asserts it is an edge of this machine (an InternalError if not):
  //   kIdle --prepare_for_backward(sync=false)--> kLocalBackward --finish_backward--> kIdle
  //   kIdle --prepare_for_backward(sync=true)---> kReducing --first hook--> kFinalizeQueued
  //   kReducing | kFinalizeQueued --finalize_backward (or a failure in it)--> kIdle
  //   kLocalBackward --prepare_for_backward / abandon--> kLocalBackward | kReducing
  //     (a no_sync backward that raised never reached finish_backward)
  enum class Phase {
    kIdle,            // no backward expected: a gradient hook now is an error outside no_sync
    kLocalBackward,   // a no_sync backward: hooks record which parameters were used
    kReducing,        // a synchronised backward before its first hook
    kFinalizeQueued,  // hooks are firing; finalize_backward is queued with autograd
  };
  bool reducing() const { return phase_ == Phase::kReducing || phase_ == Phase::kFinalizeQueued; }
  // Moves to `next`, asserting the diagram above has that edge.
  void enter(Phase next);
  // Back to kIdle, whatever the pass was: the one reset.
  void end_pass();

  mutable std::mutex mutex_;
  Phase phase_ = Phase::kIdle;
  bool local_accumulation_allowed_ = false;
  // Per synchronised backward.
  size_t next_bucket_ = 0;
  std::vector<bool> ready_;
  std::vector<int32_t> locally_used_;  // kept across no_sync micro-steps
  std::vector<size_t> unused_;         // outside the graph this time
  bool exchange_used_map_ = false;     // this pass gathers locally_used_ at its end
  std::unique_ptr<detail::IterationCheck> check_;  // Note [The iteration check]
  int64_t iteration_ = 0;
  // The last iteration whose pass ended in a failed agreement (-1: none).
  int64_t abandoned_iteration_ = -1;
  // Set by mark_diverged; sent with the next pass's iteration check.
  std::string diverged_reason_;
  std::vector<int32_t> globally_used_;
  ReductionTimeline timeline_;
  // Bucket rebuilding and static graphs.
  std::vector<size_t> ready_order_;
  std::vector<size_t> rebuilt_order_;
  bool rebuilt_ = false;
  bool rebuild_pending_ = false;
  bool static_graph_learned_ = false;
  std::vector<int32_t> expected_hook_calls_;   // static graph: firings per iteration
  std::vector<int32_t> remaining_hook_calls_;
};

}  // namespace lockstep
