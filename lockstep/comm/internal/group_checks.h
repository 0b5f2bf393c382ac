// What ProcessGroup's collectives and group building share and callers do
// not need: which backend a tensor takes, the checks every op makes, and the
// bookkeeping of a point-to-point op.
//
// Internal to lockstep/comm; ProcessGroup is the public face.
//
//   detail::check_rank(group, root, "broadcast");
//   if (detail::on_nccl(group, tensor)) ...
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/comm/process_group.h"

namespace lockstep::detail {

// Whether `tensor` goes through the group's NCCL backend.
bool on_nccl(const ProcessGroup& group, const torch::Tensor& tensor);
// Fails naming `what` when `rank` is not a rank of `group`.
void check_rank(const ProcessGroup& group, int rank, const char* what);
// Fails on a side channel (parts.out_of_order) for an op that Gloo would
// number in the shared order (Note [One mesh per process]); `on_gloo` says
// whether it runs there.
void require_ordered(const ProcessGroup::Parts& parts, bool on_gloo, const char* op);
// A collective's bookkeeping: its sequence number `seq` (the group's next),
// every other rank as a peer, the group's timeout.
OpInfo collective_info(const ProcessGroup& group, const char* op_name, long long seq);
// A send's or recv's bookkeeping: no sequence number, one peer.
OpInfo p2p_info(std::string op_name, int peer, std::chrono::milliseconds timeout);
// Waits for `work` unless the op is async; returns it.
std::shared_ptr<Work> finish_issue(std::shared_ptr<Work> work, bool async);

}  // namespace lockstep::detail
