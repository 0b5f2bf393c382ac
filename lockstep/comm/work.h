// lockstep::Work: the handle of one asynchronous collective or point-to-point
// operation issued through a lockstep::ProcessGroup.
//
// Every wait is bounded. When the time runs out the rank fails with a
// lockstep::TimeoutError that names the operation, its group and the ranks it
// was waiting for, e.g.
//
//   rank 1: all_reduce #17 on group 'world' (2 ranks) timed out after 30s waiting for ranks [0]
//
// Ranks in messages are world ranks. "Which ranks" is exact for collectives:
// a rank that has been waiting for a while publishes "I entered op #N" to the
// group's store (from a background thread, so the fast path costs nothing),
// and the rank that times out reads which peers never did. A peer that gives
// up in another collective closes its connections, which ends this one before
// its timeout: after a wait long enough for arrivals to be published, that is
// a lockstep::PeerLostError naming the ranks that never entered, e.g.
//
//   rank 1: all_gather_into_tensor #3 on group 'world.check' (2 ranks) failed after 14.6s waiting for
//   ranks [0], which never entered it and closed their connections (...)
//
//   auto work = world()->all_reduce(grad, ReduceOp::kAvg, /*async=*/true);
//   compute_something_else();
//   work->wait();                      // the group's timeout
//   work->wait(std::chrono::seconds(5));  // or an explicit one (no-op once done)
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>

#include "lockstep/compat/c10d.h"
#include "lockstep/core/error.h"

namespace lockstep {

class ProcessGroup;

namespace detail {

// What a Work is doing, for messages and for the arrival board.
struct OpInfo {
  std::string name;                  // "all_reduce", "send to rank 1 (tag 3)", ...
  long long seq = 0;                 // collective sequence number in the group; 0 for point-to-point
  std::vector<int> peers;            // group ranks this op needs (all others for a collective)
  std::chrono::milliseconds timeout{0};
};

// Thrown by lockstep's own multi-step algorithms when one step runs out of time.
class StepTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Registers a pending collective with the background arrival publisher; the
// registration ends with the object.
class ArrivalToken {
 public:
  ArrivalToken() = default;
  ArrivalToken(c10::intrusive_ptr<compat::C10dStore> store, std::string key, std::chrono::milliseconds timeout);
  ~ArrivalToken();
  C10_DISABLE_COPY_AND_ASSIGN(ArrivalToken);
  void release();

 private:
  long long id_ = 0;
};

// How long a collective is pending before its rank publishes its arrival.
std::chrono::milliseconds arrival_publish_delay(std::chrono::milliseconds timeout);

// The store key a rank publishes when it has been waiting in collective `seq`.
std::string arrival_key(long long seq, int group_rank);

std::string format_duration(std::chrono::milliseconds duration);

}  // namespace detail

class Work {
 public:
  ~Work();
  C10_DISABLE_COPY_AND_ASSIGN(Work);

  // Waits up to the group's timeout; throws TimeoutError when it runs out and
  // lockstep::Error when the operation failed (a peer died, bad input). A
  // completed Work returns at once; a failed or timed-out one rethrows its
  // failure (a timeout is final: the ranks are out of step from then on).
  void wait();
  void wait(std::chrono::milliseconds timeout);

  // True once the operation finished (successfully or not). Call wait() before
  // reading results: it also runs lockstep's post-processing (averaging,
  // dtype round trips). Gloo's send/recv only report completion through wait().
  bool is_completed();

  // "all_reduce #17 on group 'world' (2 ranks)".
  std::string description() const;

 private:
  friend class ProcessGroup;
  Work(std::shared_ptr<const ProcessGroup> group, detail::OpInfo info);

  // The ways a Work can be backed; exactly one is set by ProcessGroup.
  std::vector<c10::intrusive_ptr<compat::C10dWork>> raw_;
  std::shared_future<void> future_;
  bool has_future_ = false;
  std::function<void()> finish_;  // runs once, after success

  void complete();
  [[noreturn]] void fail_timeout(std::chrono::milliseconds waited);
  [[noreturn]] void fail(const std::exception& error);
  std::vector<int> late_peers() const;
  std::vector<int> late_world_peers() const;

  std::shared_ptr<const ProcessGroup> group_;
  detail::OpInfo info_;
  std::unique_ptr<detail::ArrivalToken> arrival_;
  std::chrono::steady_clock::time_point issued_ = std::chrono::steady_clock::now();
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace lockstep
