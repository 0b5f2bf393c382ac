// Agreeing on the outcome of a phase: every rank fails together, and fast,
// when one rank's part of a collective phase fails.
//
// Note [Failing together]
// A rank that fails alone in a phase the others believe went well (rank 0's
// checkpoint write hits ENOSPC, one rank cannot read the checkpoint chosen for
// resuming, one rank's shard write throws) leaves its peers moving on into the
// next collective. Over Gloo, a peer that exits is noticed at once; a peer
// that catches the error and stays alive (a program that owns its loop), or
// any peer over NCCL, leaves the others waiting until the collective timeout
// (30 minutes by default). After such a phase every rank therefore all-reduces
// one status flag: where all succeeded that is the whole cost (one tiny
// all-reduce per phase, not per step); where any failed, the ranks exchange
// their messages and every rank throws the same error, naming the lowest
// failing rank and its reason, within one round trip.
//
//   lockstep::agree_on_outcome(*world, "saving checkpoint " + path, [&] {
//     if (world->rank() == 0) write_checkpoint(path, contents);
//   });
//   // here the file is on disk, on every rank's word; or every rank threw
//   // "saving checkpoint ...: failed on rank 0 of 2: No space left on device"
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "lockstep/core/error.h"

namespace lockstep {

class ProcessGroup;

// What every rank of a group throws when a phase failed on any of them: the
// same message everywhere, naming the lowest failing rank and its reason.
// An agreement over the same group around it passes it on (Note [An
// agreement inside an agreement]).
class AgreedFailure : public DistributedError {
 public:
  AgreedFailure(const std::string& message, std::string group) : DistributedError(message), group_(std::move(group)) {}
  const std::string& group() const { return group_; }

 private:
  std::string group_;
};

// Runs `body` on this rank, then agrees with every rank of `group` on whether
// all of them succeeded (collective: every rank calls it, with its own body).
// Throws lockstep::AgreedFailure on every rank if any body threw (on one
// process: lockstep::Error). `phase` says what the ranks were doing, for the
// message.
void agree_on_outcome(ProcessGroup& group, const std::string& phase, const std::function<void()>& body);

// The same, for a phase whose outcome this rank already knows (`local_error`
// null: it succeeded).
void agree_on_outcome(ProcessGroup& group, const std::string& phase, const std::exception_ptr& local_error);

// Whether `local` is true on any rank of `group` (collective, one all-reduce).
bool any_rank_true(ProcessGroup& group, bool local);

}  // namespace lockstep
