// The rendezvous of an elastic job (`lockstep run --nnodes MIN:MAX`): which
// nodes take part in each round, in what order, and where the round's
// workers meet, as torchrun's rendezvous decides it. Two backends implement
// it: c10d's (rounds on the store of the launcher at --rdzv-endpoint,
// lockstep/launch/c10d_rendezvous.h) and etcd's (rounds on an etcd cluster,
// so that no node is special, lockstep/launch/etcd_rendezvous.h).
//
//   std::unique_ptr<ElasticRendezvous> rdzv = make_c10d_rendezvous(options, hosts_the_store);
//   auto joined = rdzv->join(/*after_round=*/-1, /*failed=*/false, interrupted);   // the first round
//   rdzv->watch(*joined);   // start this node's workers as joined->group_rank of joined->nnodes,
//                           // meeting at joined->store_host:joined->store_port
//   ... if (!rdzv->restart_reason().empty()) stop the workers ...
//   joined = rdzv->join(joined->round, /*failed=*/true, interrupted);   // the next round
//
// Both number a round's nodes alike: the nodes of the previous round in
// their old order, then new nodes in the order they arrived; both close a
// round once MAX nodes are in it, or MIN are and the last call
// (`last_call_timeout`) has passed; both end a running round when a node
// enters the next one because its workers failed, or a new node arrives
// while the round has fewer than MAX. A round entered after a failure
// counts as a restart (`restarts`); one entered to grow does not.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lockstep {

class ElasticRendezvous {
 public:
  struct Options {
    std::string host;  // c10d: the launcher that hosts the store
    int port = 0;
    int min_nodes = 1;
    int max_nodes = 1;
    int nproc_per_node = 1;
    std::string node_name;  // for messages: this launcher's host name and pid
    std::chrono::milliseconds join_timeout{600000};
    std::chrono::milliseconds last_call_timeout{30000};
  };

  // Where this node stands in a closed round.
  struct Round {
    int round = 0;
    int group_rank = 0;
    int nnodes = 1;
    int restarts = 0;                     // rounds entered after a failure, this one included
    std::vector<std::string> node_names;  // by group rank
    std::string store_host;               // where the round's workers meet (MASTER_ADDR, MASTER_PORT)
    int store_port = 0;
  };

  virtual ~ElasticRendezvous() = default;

  // Takes a ticket in the round after `after_round` (-1: the round open now)
  // and waits until a round admits this node. `failed`: this node's workers
  // failed, so the round counts as a restart. Returns nullopt when
  // `interrupted` returns true or the job has finished meanwhile (finished()
  // then says so). Throws lockstep::Error after the join timeout, or when the
  // job was aborted (another node ran out of restarts).
  virtual std::optional<Round> join(int after_round, bool failed, const std::function<bool()>& interrupted) = 0;

  // From now on restart_reason() reports why `round` should end.
  virtual void watch(const Round& round) = 0;
  // Why this node's workers should stop for the next round ("" while none waits).
  virtual std::string restart_reason() const = 0;

  // This node's workers all succeeded: late nodes are told the job is over.
  virtual void mark_finished() = 0;
  bool finished() const { return finished_; }
  // This node gives up (no restarts left): every waiting node fails with `why`.
  virtual void abort(const std::string& why) = 0;

  // "the rendezvous at 10.0.0.1:29500", "etcd at https://a:2379, https://b:2379", for messages.
  virtual std::string where() const = 0;

 protected:
  bool finished_ = false;
  int previous_rank_ = -1;  // this node's group rank in the last round it ran in
};

}  // namespace lockstep
