#include "lockstep/launch/internal/restart_policy.h"

#include <unistd.h>

#include <chrono>
#include <utility>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/launch/c10d_rendezvous.h"
#include "lockstep/launch/etcd_rendezvous.h"
#include "lockstep/launch/internal/launcher_output.h"
#include "lockstep/launch/restart_rounds.h"

namespace lockstep {

// Note [One supervisor loop]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A fixed job and an elastic job stop and restart their workers the same way:
// start them, supervise them until they all end, then
//   - a requeue request (exit 75 for a preemption) or a signal ends the
//     launcher at once;
//   - success ends the job;
//   - a failure with no restarts left ends it with the failure's code;
//   - otherwise the next start, after a failure or a stop for another node.
// What differs is only where the next start is and whether it costs a
// restart: a fixed node restarts in place (with several nodes, all enter the
// restart together), an elastic node starts in whichever round its
// rendezvous admits it to, and a round it entered to let a node join costs
// nothing. So Supervisor::run() is that one loop, and a RestartPolicy
// answers those two questions; the stop, kill, grace and requeue handling
// exists once.

namespace {

std::chrono::milliseconds seconds_option(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// --nnodes N: the placement never changes; every start after the first is a
// restart, entered by all nodes together when there are several.
class FixedRestarts final : public RestartPolicy {
 public:
  FixedRestarts(const LaunchOptions& options, int master_port) : options_(options) {
    if (!options_.standalone() && options_.nnodes() > 1 && options_.max_restarts() > 0) {
      rounds_ = std::make_unique<RestartRounds>(options_.master_addr(), master_port, options_.nnodes(),
                                                options_.node_rank(), seconds_option(options_.join_timeout()));
    }
  }

  std::optional<NodePlacement> next_start(const NodePlacement* previous, bool /*failed*/,
                                          const std::function<bool()>& interrupted) override {
    if (previous == nullptr) return NodePlacement::fixed(options_, 0);
    const int restart = previous->restart_count + 1;
    if (rounds_) {
      say(str_cat("waiting for every node to join restart ", restart));
      if (!rounds_->enter(restart, interrupted)) return std::nullopt;
    }
    say(str_cat("restarting all workers (restart ", restart, " of ", options_.max_restarts(), ")"));
    return NodePlacement::fixed(options_, restart);
  }

  bool counts_as_restart(bool /*failed*/) const override { return true; }

  void watch(const NodePlacement& placement) override {
    if (rounds_) rounds_->watch(placement.restart_count);
  }

  std::string stop_reason() const override {
    if (rounds_ && rounds_->node_waiting() >= 0) return str_cat("node ", rounds_->node_waiting(), " is restarting the job");
    return "";
  }

  void finished() override {}
  void give_up(const NodePlacement& /*placement*/) override {}

 private:
  const LaunchOptions& options_;
  std::unique_ptr<RestartRounds> rounds_;  // several nodes with restarts only
};

std::string this_node_name() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return str_cat(host, ":", getpid());
}

std::string joined(const std::vector<std::string>& list) {
  std::string text;
  for (const auto& name : list) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// --nnodes MIN:MAX (or any job on etcd): each start is in the round the
// rendezvous admits this node to.
class ElasticRestarts final : public RestartPolicy {
 public:
  ElasticRestarts(const LaunchOptions& options, std::unique_ptr<ElasticRendezvous> rendezvous)
      : options_(options), rendezvous_(std::move(rendezvous)) {}

  std::optional<NodePlacement> next_start(const NodePlacement* previous, bool failed,
                                          const std::function<bool()>& interrupted) override {
    if (previous == nullptr) {
      say(str_cat("elastic job of ", options_.min_nodes(), " to ", options_.nnodes(), " nodes: joining ",
                  rendezvous_->where()));
    } else {
      say(str_cat("joining rendezvous round ", previous->round + 1));
    }
    std::optional<ElasticRendezvous::Round> round =
        rendezvous_->join(previous != nullptr ? previous->round : -1, failed, interrupted);
    if (!round) {
      if (rendezvous_->finished()) say("the job finished while this node waited to join it");
      return std::nullopt;
    }
    round_ = *round;
    const int nproc = options_.nproc_per_node();
    say(str_cat("rendezvous round ", round_.round, ": node ", round_.group_rank, " of ", round_.nnodes, " (ranks ",
                round_.group_rank * nproc, "..", (round_.group_rank + 1) * nproc - 1, " of ", round_.nnodes * nproc,
                "; nodes ", joined(round_.node_names), "), restarts used ", round_.restarts, " of ",
                options_.max_restarts()));
    NodePlacement placement;
    placement.node_rank = round_.group_rank;
    placement.nnodes = round_.nnodes;
    placement.restart_count = round_.restarts;
    placement.round = round_.round;
    placement.master_addr = round_.store_host;
    placement.master_port = round_.store_port;
    return placement;
  }

  bool counts_as_restart(bool failed) const override { return failed; }

  void watch(const NodePlacement& /*placement*/) override { rendezvous_->watch(round_); }

  std::string stop_reason() const override {
    const std::string reason = rendezvous_->restart_reason();
    return reason.empty() ? "" : str_cat("a new rendezvous round is starting (", reason, ")");
  }

  void finished() override { rendezvous_->mark_finished(); }

  void give_up(const NodePlacement& /*placement*/) override {
    rendezvous_->abort(str_cat("node ", round_.node_names.at(static_cast<size_t>(round_.group_rank)),
                               " ran out of restarts (--max-restarts ", options_.max_restarts(), ")"));
  }

 private:
  const LaunchOptions& options_;
  std::unique_ptr<ElasticRendezvous> rendezvous_;
  ElasticRendezvous::Round round_;  // the last round joined
};

}  // namespace

std::unique_ptr<RestartPolicy> make_restart_policy(const LaunchOptions& options, int master_port,
                                                   const std::string& run_id, const std::string& job_token,
                                                   bool hosts_store) {
  if (!options.elastic()) return std::make_unique<FixedRestarts>(options, master_port);
  ElasticRendezvous::Options rdzv;
  rdzv.host = options.master_addr();
  rdzv.port = master_port;
  rdzv.min_nodes = options.min_nodes();
  rdzv.max_nodes = options.nnodes();
  rdzv.nproc_per_node = options.nproc_per_node();
  rdzv.node_name = this_node_name();
  rdzv.join_timeout = seconds_option(options.join_timeout());
  rdzv.last_call_timeout = seconds_option(options.last_call_timeout());
  if (options.rdzv_backend() == "etcd") {
    EtcdRendezvousSettings settings;
    settings.etcd = options.etcd();
    settings.run_id = run_id;
    settings.token = job_token;
    settings.lease_ttl = std::chrono::seconds(static_cast<long long>(options.lease_ttl()));
    settings.local_addr = options.local_addr();
    return std::make_unique<ElasticRestarts>(options, make_etcd_rendezvous(rdzv, settings));
  }
  return std::make_unique<ElasticRestarts>(options, make_c10d_rendezvous(rdzv, hosts_store));
}

}  // namespace lockstep
