// Restart rounds shared by the launchers of a multi-node job, so that all of
// them restart their workers together, into the same attempt, as torchrun's
// agents do through their rendezvous.
//
// Without it each node would count its own restarts: a node that notices a
// failure late (its link was down; its workers were slower to time out)
// would start attempt 1 after the others had given up on attempt 1 and gone
// on to attempt 2, and the job would burn its restarts without ever meeting.
//
//   RestartRounds rounds("10.0.0.1", 29500, /*nnodes=*/2, /*node_rank=*/1, std::chrono::seconds(600));
//   rounds.watch(0);                 // while attempt 0 runs: has another node moved on?
//   ... if (rounds.node_waiting() >= 0) stop this node's workers ...
//   rounds.enter(1, interrupted);    // announce round 1, wait for every node to enter it
//
// Through node 0's store: entering round r sets "lockstep/launch/round/<r>/node/<k>";
// a background thread polls the other nodes' keys of the next round (its own
// connection, so a network outage stalls it, not the launcher), and enter()
// waits until every node's key exists. Store operations that fail (node 0
// unreachable) are retried on a fresh connection until the join timeout, so a
// link that comes back in time costs nothing but the wait.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <c10/macros/Macros.h>

namespace lockstep {

class RestartRounds {
 public:
  RestartRounds(std::string host, int port, int nnodes, int node_rank, std::chrono::milliseconds join_timeout);
  ~RestartRounds();
  C10_DISABLE_COPY_AND_ASSIGN(RestartRounds);

  // From now on node_waiting() reports another node that entered round + 1.
  void watch(int round);
  // A node that has entered the round after the watched one, or -1.
  int node_waiting() const;
  // Announces this node in `round` and waits until every node has announced
  // itself; throws lockstep::Error naming the missing nodes after the join
  // timeout. `interrupted` is asked between polls; when it returns true,
  // enter() returns false at once.
  bool enter(int round, const std::function<bool()>& interrupted);

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  std::thread watcher_;
};

}  // namespace lockstep
