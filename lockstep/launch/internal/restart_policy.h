// How `lockstep run` goes from one start of a node's workers to the next: the
// one thing a fixed job and an elastic job do differently. The supervisor
// has one loop (Note [One supervisor loop] in restart_policy.cpp):
//
//   std::unique_ptr<RestartPolicy> policy = make_restart_policy(options, port, run_id, token, hosts_store);
//   std::optional<NodePlacement> at = policy->next_start(nullptr, /*failed=*/false, interrupted);
//   while (at) {
//     policy->watch(*at);
//     ... start the workers at *at; stop them if !policy->stop_reason().empty() ...
//     ... success: policy->finished(); a failure with no restarts left: policy->give_up(*at) ...
//     at = policy->next_start(&*at, failed, interrupted);
//   }
//
// A fixed job (--nnodes N) restarts in place: every start after the first is
// a restart, and several nodes enter each restart together (RestartRounds).
// An elastic job (--nnodes MIN:MAX) starts each time in the round its
// rendezvous admits it to (ElasticRendezvous, c10d or etcd), and only a round
// entered after a failure counts as a restart.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "lockstep/launch/launcher.h"

namespace lockstep {

class RestartPolicy {
 public:
  virtual ~RestartPolicy() = default;

  // Where this node's workers start next, after `previous` ended (nullptr:
  // the first start; `failed`: its workers failed rather than stopped for
  // another node). nullopt: nothing more to run, because `interrupted`
  // returned true or (elastic) the job finished while this node waited.
  // Throws lockstep::Error when the other nodes cannot be met.
  virtual std::optional<NodePlacement> next_start(const NodePlacement* previous, bool failed,
                                                  const std::function<bool()>& interrupted) = 0;
  // Whether the start after one that ended so would use up a restart.
  virtual bool counts_as_restart(bool failed) const = 0;

  // From now on stop_reason() tells why the workers started at `placement`
  // must stop for a start elsewhere.
  virtual void watch(const NodePlacement& placement) = 0;
  // Why this node's healthy workers must stop ("" while they need not).
  virtual std::string stop_reason() const = 0;

  // This node's workers succeeded.
  virtual void finished() = 0;
  // This node ran out of restarts after `placement` failed.
  virtual void give_up(const NodePlacement& placement) = 0;
};

// A fixed job's policy, or with --nnodes MIN:MAX or --rdzv-backend etcd an
// elastic one (which joins its rendezvous only in the first next_start).
std::unique_ptr<RestartPolicy> make_restart_policy(const LaunchOptions& options, int master_port,
                                                   const std::string& run_id, const std::string& job_token,
                                                   bool hosts_store);

}  // namespace lockstep
