// The rendezvous of an elastic job (`lockstep run --nnodes MIN:MAX`): which
// nodes take part in each round, and in what order, as torchrun's c10d
// rendezvous decides it.
//
//   ElasticRendezvous::Options o;
//   o.host = "10.0.0.1"; o.port = 29500; o.min_nodes = 2; o.max_nodes = 3; o.nproc_per_node = 2;
//   ElasticRendezvous rdzv(o, /*coordinator=*/hosts_the_store);
//   auto joined = rdzv.join(/*after_round=*/-1, /*failed=*/false, interrupted);   // the first round
//   rdzv.watch(*joined);               // start this node's workers as joined->group_rank of joined->nnodes
//   ... if (!rdzv.restart_reason().empty()) stop the workers ...
//   joined = rdzv.join(joined->round, /*failed=*/true, interrupted);   // the next round
//
// Rounds live on the store the launcher at --master-addr hosts (the
// coordinator). Every launcher that wants to run joins the open round by
// taking a ticket (an atomic counter); the coordinator closes the round when
// MAX nodes hold tickets, or when at least MIN do and the last call
// (`last_call_timeout`, torchrun's name) has passed since the MIN-th arrived.
// A round after the first closes only once a node of the running round holds
// a ticket in it (the running round is over): new nodes alone wait for that.
// The first N tickets are admitted. Group ranks: the nodes of the previous
// round in their old order, then new nodes by ticket; every node reads the
// same list, so ranks, local ranks and node groups are numbered alike
// everywhere. A ticket past N waits for the next round.
//
// While a round runs, every admitted node watches the next one: a node that
// enters it because its workers failed, or a new node while the round has
// fewer than MAX, makes all nodes stop their workers and join it. A round
// entered after a failure counts as a restart (`restarts` in the result);
// one entered to grow does not, as with torchrun's membership changes.
//
// Store keys, under "lockstep/elastic/": open (the round taking tickets),
// round/<r>/count, round/<r>/node/<ticket> ("<nproc> <previous round> <previous
// rank> <name>"; nodes of the previous round keep their order, new ones follow), round/<r>/failed,
// round/<r>/closed ("<N> <restarts>"), finished, abort.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace lockstep {

class ElasticRendezvous {
 public:
  struct Options {
    std::string host;
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
  };

  // `coordinator`: this launcher hosts the store and closes the rounds.
  ElasticRendezvous(Options options, bool coordinator);
  ~ElasticRendezvous();
  ElasticRendezvous(const ElasticRendezvous&) = delete;
  ElasticRendezvous& operator=(const ElasticRendezvous&) = delete;

  // Takes a ticket in the round after `after_round` (-1: the round open now)
  // and waits until a round admits this node. `failed`: this node's workers
  // failed, so the round counts as a restart. Returns nullopt when
  // `interrupted` returns true or the job has finished meanwhile (finished()
  // then says so). Throws lockstep::Error after the join timeout, or when the
  // job was aborted (another node ran out of restarts).
  std::optional<Round> join(int after_round, bool failed, const std::function<bool()>& interrupted);

  // From now on restart_reason() reports nodes waiting in the round after `round`.
  void watch(const Round& round);
  // Why this node's workers should stop for the next round ("" while none waits).
  std::string restart_reason() const;

  // This node's workers all succeeded: late nodes are told the job is over.
  void mark_finished();
  bool finished() const { return finished_; }
  // This node gives up (no restarts left): every waiting node fails with `why`.
  void abort(const std::string& why);

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  std::thread watcher_, coordinator_;
  bool finished_ = false;
  int previous_rank_ = -1;  // this node's group rank in the last round it ran in
};

}  // namespace lockstep
