#include "lockstep/engine/run_stop.h"

#include <algorithm>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/engine/trainer.h"

namespace lockstep {

int64_t RunStop::last_iteration() const {
  return trainer_.phase_ == TrainerPhase::kInStep ? trainer_.iter() + 1 : trainer_.iter();
}

void RunStop::begin(int64_t max_iter, std::vector<int64_t> vote_intervals) {
  max_iter_ = max_iter;
  stopped_early_ = false;
  vote_intervals_ = std::move(vote_intervals);
  votes_ = agreement_ && !vote_intervals_.empty();
  stop_requested_here_ = preemption_requested_here_ = preempted_ = false;
}

void RunStop::request(const std::string& reason) {
  LOCKSTEP_CHECK(!agreement_ || votes_, "stop().request(\"", reason, "\") at iteration ", trainer_.iter(),
                 " of a distributed run, but no registered hook declares may_request_stop(): the ranks agree on "
                 "stops only then, and without that this rank would stop alone while the others train on. Override "
                 "may_request_stop() to return true in the hook that stops (EarlyStoppingHook does).");
  stop_requested_here_ = true;
  const int64_t last = last_iteration();
  if (stopped_early_ && max_iter_ <= last) return;
  if (trainer_.phase_ == TrainerPhase::kInStep) {
    logger().info("Stopping training after iteration {}: {}", trainer_.iter(), reason);
  } else {
    logger().info("Stopping training before iteration {}: {}", trainer_.iter(), reason);
  }
  stopped_early_ = true;
  max_iter_ = std::min(max_iter_, last);
}

void RunStop::request_preemption(const std::string& reason) {
  LOCKSTEP_CHECK(!agreement_ || votes_, "stop().request_preemption(\"", reason, "\") at iteration ", trainer_.iter(),
                 " of a distributed run, but no registered hook declares may_request_stop()");
  if (preemption_requested_here_ || preempted_) return;
  preemption_requested_here_ = true;
  if (agreement_) {
    logger().info("{}: stopping at the iteration every rank agrees on, to save and exit", reason);
    return;
  }
  // One process: nothing to agree, the stop is now.
  stop_for_preemption(reason);
}

void RunStop::stop_for_preemption(const std::string& reason) {
  // On the last iteration the run simply finishes.
  if (last_iteration() >= max_iter_) return;
  preempted_ = true;
  request(reason + "; saving to resume later");
}

void RunStop::vote() {
  if (!votes_) return;
  const int64_t iter = trainer_.iter();
  const auto votes_after = [iter](int64_t every) { return (iter + 1) % every == 0; };
  if (trainer_.phase_ == TrainerPhase::kInStep &&
      std::none_of(vote_intervals_.begin(), vote_intervals_.end(), votes_after)) {
    return;  // no vote at this iteration: a request waits for the next
  }
  const bool stop_here = stop_requested_here_;
  const bool preemption_here = preemption_requested_here_;
  stop_requested_here_ = false;
  // Note [Stopping for a preemption]: a rank's signal is a vote, not a stop:
  // the signal reaches the ranks up to an iteration apart, and hooks that
  // save (collectively) must see the same run on every rank. A second vote,
  // only on the iteration that stops, tells a preemption from an early stop.
  if (!agreement_(stop_here || preemption_here)) return;
  const bool preemption_anywhere = agreement_(preemption_here);
  if (preemption_anywhere) {
    stop_for_preemption(preemption_here ? "stop signal received" : "another rank received a stop signal");
  } else if (!stop_here) {
    request("another rank asked to stop at this iteration");
  }
  stop_requested_here_ = false;
}

void RunStop::end_at(int64_t iteration) {
  if (iteration < max_iter_) {
    stopped_early_ = true;
    max_iter_ = iteration;
  }
}

}  // namespace lockstep
