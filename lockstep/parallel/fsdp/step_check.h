// StepCheck: proof that every rank of an FSDP job ran the same step with the
// same unit collectives in the same order.
//
// Note [FSDP's step check]
// FSDP's collectives carry no names: if one rank skipped an iteration, its
// gathers and reductions of the next iteration pair up with the others'
// (units of equal size even gather into each other), and training goes on
// with gradients of different steps summed together. So each rank keeps a
// running hash of the collectives its units issue (unit index and kind, in
// order) and all-gathers [iteration, count, hash] on a side channel of its
// own (Note [One mesh per process]: its own tags, or NCCL communicator),
// asynchronously, twice per backward:
//   - launched when backward begins (covering the forward), checked before
//     backward issues its first collective -- while the last layers' backward
//     computes, so it has arrived: no extra blocking round trip;
//   - launched when backward ends (covering the backward), checked after the
//     optimizer step and before the next forward.
// A skipped step or units run in another order then fail on every rank with
// a message that says so, before gradients of different steps are reduced
// together. A rank that issued fewer collectives than another waits at the
// check while the other waits in a collective it never joined: both end at
// the group's timeout, the check's error saying what that means. The check's
// group is used for nothing else, so its exchange, in flight while units
// gather and reduce, never interleaves with their collectives. DDP exchanges
// the iteration instead, with every synchronised backward
// (Note [The iteration check] in parallel/ddp/reducer.cpp).
//
//   fsdp::StepCheck check(group->side_channel("fsdp0.check"));
//   check.record(unit, fsdp::StepCheck::Kind::kGather);   // FlatParamUnit does this
//   check.launch(iteration);                              // FSDP's begin/end of backward
//   check.verify();                                       // throws if ranks disagree
#pragma once

#include <cstdint>
#include <memory>

#include <torch/types.h>

namespace lockstep {
class ProcessGroup;
class Work;
}  // namespace lockstep

namespace lockstep::fsdp {

class StepCheck {
 public:
  // kReduceSet: which parameters a per-parameter unit reduces (`detail`
  // hashes the set; Note [FSDP2's gradients] in shard_gradients.cpp).
  enum class Kind : uint64_t { kGather = 1, kReduce = 2, kReplicaReduce = 3, kReduceSet = 4 };

  // `group`: every rank of the FSDP job, used for nothing else. Null: one process, nothing to check.
  explicit StepCheck(std::shared_ptr<ProcessGroup> group);
  ~StepCheck();

  // A unit issued a collective (local).
  void record(int unit, Kind kind, uint64_t detail = 0);
  // Starts the exchange for what was recorded since the last launch
  // (collective over the check group; every rank calls it at the same point).
  void launch(int64_t iteration);
  // Waits for the exchange launched last, if any, and throws naming every
  // rank's iteration and collective count when the ranks disagree.
  void verify();
  bool pending() const { return work_ != nullptr; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  uint64_t hash_;
  int64_t count_ = 0;
  std::shared_ptr<Work> work_;
  torch::Tensor gathered_;
  torch::Tensor mine_;
};

}  // namespace lockstep::fsdp
