// detail::NodeHierarchy: the hierarchical all_reduce behind
// ProcessGroup::enable_hierarchical_all_reduce (process_group.h), as one rank
// sees it. Internal to lockstep/comm.
//
// Three stages -- reduce within the node, all_reduce among the nodes' first
// ranks (the leaders), broadcast within the node -- each on a thread and a
// subgroup of its own, so that one piece crosses the network while the next
// is reduced within its node and the previous one is broadcast: the link never
// waits for loopback work. Each stage takes pieces in issue order, which keeps
// each subgroup's collectives in one order on every rank.
//
//   auto hierarchy = detail::NodeHierarchy::create(group, {0, 0, 1, 1});  // null: not worth it
//   hierarchy->all_reduce(tensor, ReduceOp::kSum).get();
#pragma once

#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/comm/process_group.h"
#include "lockstep/comm/internal/ring.h"

namespace lockstep::detail {

struct NodeHierarchy {
  // Collective over `group` (creates the subgroups). Null when the split has
  // one node or no node with more than one rank.
  static std::shared_ptr<NodeHierarchy> create(ProcessGroup& group, const std::vector<int>& node_of_rank);

  // Reduces `data` (contiguous, a dtype Gloo reduces) in place on every rank;
  // the future is done when every piece is, and fails with the first error.
  std::shared_future<void> all_reduce(const at::Tensor& data, ReduceOp op);

  std::shared_ptr<ProcessGroup> node_reduce;     // this rank's node; null when it is alone there
  std::shared_ptr<ProcessGroup> node_broadcast;  // the same ranks, a group of its own
  std::shared_ptr<ProcessGroup> leaders;         // the first rank of every node; null on the others
  std::string description;                       // "2 nodes of 2, 2 ranks"

 private:
  // Once a stage has failed, its subgroups are out of step with the other
  // ranks' (this rank skipped a collective they issued): every later stage
  // fails at once with the first error instead of pairing with the wrong
  // collective, or waiting out a timeout per queued piece.
  void guarded(const std::function<void()>& body);

  std::mutex failure_mutex_;
  std::exception_ptr failure_;
  // Declared last: destroyed first, finishing their queues while the
  // subgroups above still exist.
  SerialExecutor reduce_stage_;
  SerialExecutor cross_stage_;
  SerialExecutor broadcast_stage_;
};

}  // namespace lockstep::detail
