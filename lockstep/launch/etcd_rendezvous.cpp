#include "lockstep/launch/etcd_rendezvous.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include <c10/macros/Macros.h>

#include "lockstep/compat/c10d.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/comm/job_identity.h"
#include "lockstep/launch/internal/background_threads.h"
#include "lockstep/launch/internal/etcd_rounds.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using etcd_rounds::EtcdShared;
using etcd_rounds::Entry;
using etcd_rounds::has_entry;
using etcd_rounds::parse_closed;
using etcd_rounds::read_round;
using etcd_rounds::RoundState;

// Note [The etcd join, state by state]
// A node joining the job moves through four states, a function each, and
// every move is asserted (move_phase):
//
//   choose round --> enter --> wait in round --(closed with it)--> await store --> joined
//                      ^            |
//                      +------------+  its entry expired: enter again;
//                                      closed without it: enter the next round
//   await store --(node 0 died before publishing the store)--> choose round,
//                                      after that round, as a failed one
//
// A state reads what it needs from etcd and says whether the join goes on at
// once (the next state has work to do) or waits until the job's keys change,
// the last call ends, or a second passes. Before each state the join looks at
// the job as a whole: given up (an error) or finished (no round for this node).
struct JoinAttempt {
  enum class State { kChooseRound, kEnter, kWaitInRound, kAwaitStore, kJoined };
  State state = State::kChooseRound;
  int after_round = -1;  // the round this node last ran in (-1: none)
  bool failed = false;   // that round ended in a failure: the next one counts a restart
  int round = -1;        // the round being joined
  std::optional<ElasticRendezvous::Round> admitted;  // the round closed with this node in it
  std::optional<Clock::time_point> ready_since;      // enough nodes since then: the last call runs
  int64_t revision = 0;  // of the round as last read: a wait watches from there

  void move(State to) {
    constexpr unsigned kMayComeFrom[] = {
        phase_bit(State::kAwaitStore),                                 // choose round: node 0 died
        phase_bit(State::kChooseRound) | phase_bit(State::kWaitInRound),  // enter
        phase_bit(State::kEnter),                                      // wait in round
        phase_bit(State::kWaitInRound),                                // await store
        phase_bit(State::kAwaitStore),                                 // joined
    };
    constexpr const char* kNames[] = {"choose round", "enter", "wait in round", "await store", "joined"};
    move_phase("the etcd join", state, to, kMayComeFrom, kNames);
  }
};

// What a join state leaves to do: the next state at once, or wait for a change.
enum class JoinNext { kNow, kWait };

class EtcdRendezvous : public ElasticRendezvous {
 public:
  EtcdRendezvous(Options options, EtcdRendezvousSettings settings);
  ~EtcdRendezvous() override;
  C10_DISABLE_COPY_AND_ASSIGN(EtcdRendezvous);

  std::optional<Round> join(int after_round, bool failed, const std::function<bool()>& interrupted) override;
  void watch(const Round& round) override;
  std::string restart_reason() const override;
  void mark_finished() override;
  void abort(const std::string& why) override;
  std::string where() const override { return str_cat("etcd at ", etcd_.endpoints()); }

 private:
  void check_job_token();
  int64_t lease();
  // The join's states (Note [The etcd join, state by state]).
  JoinNext run_state(JoinAttempt& join);
  JoinNext choose_round(JoinAttempt& join);
  JoinNext enter_round(JoinAttempt& join);
  JoinNext wait_in_round(JoinAttempt& join);
  JoinNext await_store(JoinAttempt& join);
  void enter(int round, int after_round, bool failed);
  bool try_close(int round, const RoundState& state);
  bool running_round_over(int round, const RoundState& state);
  std::optional<std::pair<std::string, int>> round_store(const Round& round, const RoundState& state);
  void fail_if_given_up();
  bool job_alive();
  void forget_ended_run();
  std::string refused(const std::string& why) const;

  std::shared_ptr<EtcdShared> shared_;
  EtcdClient etcd_;
  // A watch asks about the stop signal once a second: 3 s to end.
  BackgroundThreads threads_{std::chrono::seconds(3)};  // the lease keeper and the watcher
  c10::intrusive_ptr<compat::C10dStore> store_;  // node 0 of the running round: its workers' store
};

EtcdRendezvous::EtcdRendezvous(Options options, EtcdRendezvousSettings settings)
    : shared_(std::make_shared<EtcdShared>()), etcd_(settings.etcd) {
  LOCKSTEP_CHECK(options.min_nodes >= 1 && options.min_nodes <= options.max_nodes, "lockstep run: --nnodes ",
                 options.min_nodes, ":", options.max_nodes, " needs 1 <= MIN <= MAX");
  LOCKSTEP_CHECK(!settings.run_id.empty(), "lockstep run: --rdzv-backend etcd needs --rdzv-id (the job's name on etcd, "
                 "the same on every node)");
  LOCKSTEP_CHECK(!settings.token.empty(), "lockstep run: --rdzv-backend etcd needs a job token shared by every node "
                 "(LOCKSTEP_JOB_TOKEN or --job-token)");
  LOCKSTEP_CHECK(settings.lease_ttl.count() >= 2, "lockstep run: --rdzv-conf lease_ttl must be at least 2 s");
  shared_->options = std::move(options);
  shared_->settings = std::move(settings);
  const JobIdentity job{shared_->settings.run_id, shared_->settings.token};
  shared_->keys = str_cat("/lockstep/rdzv/", job.run_id, "/", job_key_prefix(job));
  check_job_token();
  shared_->stop = threads_.stop_signal();
  threads_.start([shared = shared_] { etcd_rounds::keep_lease(shared); });
  threads_.start([shared = shared_] { etcd_rounds::watch_rounds(shared); });
}

EtcdRendezvous::~EtcdRendezvous() {
  threads_.stop();
  // This node's entries go now rather than a lease_ttl later. The others
  // end their round for it only if the job has not finished.
  int64_t lease = 0;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    lease = shared_->lease;
  }
  if (lease != 0) {
    try {
      etcd_.revoke_lease(lease);
    } catch (const std::exception&) {
    }
  }
}

std::string EtcdRendezvous::refused(const std::string& why) const {
  return str_cat("lockstep run: node ", shared_->options.node_name, " refused by job '", shared_->settings.run_id,
                 "' on ", where(), ": ", why);
}

// The first node writes the job token's check value; the others compare. etcd
// is not reachable yet when a cluster and its job start together: a few tries.
void EtcdRendezvous::check_job_token() {
  const JobIdentity job{shared_->settings.run_id, shared_->settings.token};
  const std::string record = str_cat("/lockstep/rdzv/", job.run_id, "/job");
  const std::string check = job_check_value(job);
  const auto deadline = Clock::now() + std::min<milliseconds>(shared_->options.join_timeout, std::chrono::seconds(10));
  while (true) {
    try {
      if (etcd_.create(record, check)) return;
      const auto kv = etcd_.get(record);
      LOCKSTEP_CHECK(!kv || kv->value == check, refused("wrong job token (LOCKSTEP_JOB_TOKEN or --job-token must be "
                     "the same on every node; or another job already uses this --rdzv-id)"));
      if (kv) return;
    } catch (const EtcdRefusedError& error) {
      LOCKSTEP_FAIL("lockstep run: node ", shared_->options.node_name, ": ", error.what());
    } catch (const EtcdError& error) {
      if (Clock::now() >= deadline) LOCKSTEP_FAIL("lockstep run: node ", shared_->options.node_name, ": ", error.what());
    }
    std::this_thread::sleep_for(milliseconds(500));
  }
}

int64_t EtcdRendezvous::lease() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  if (shared_->lease == 0) shared_->lease = etcd_.grant_lease(shared_->settings.lease_ttl);
  return shared_->lease;
}

// Does any node of the job hold an entry in the open round or the one before it?
bool EtcdRendezvous::job_alive() {
  const auto open = etcd_.get(shared_->key("open"));
  if (!open) return false;
  const int round = std::atoi(open->value.c_str());
  for (int r : {round - 1, round}) {
    if (r >= 0 && !read_round(etcd_, *shared_, r).entries.empty()) return true;
  }
  return false;
}

// A run that finished (or was given up) under this --rdzv-id leaves its keys
// on etcd; a node that starts the job again after all its nodes have gone
// clears them (in one transaction, guarded by the record it saw, so that two
// such nodes clear once). While a node of that run is alive, its end stands.
void EtcdRendezvous::forget_ended_run() {
  for (const char* name : {"finished", "abort"}) {
    const auto record = etcd_.get(shared_->key(name));
    if (!record) continue;
    if (!job_alive()) etcd_.erase_prefix_if(shared_->keys, shared_->key(name), record->mod_revision);
    return;
  }
}

void EtcdRendezvous::fail_if_given_up() {
  if (auto why = etcd_.get(shared_->key("abort"))) LOCKSTEP_FAIL("lockstep run: the job was given up: ", why->value);
}

void EtcdRendezvous::enter(int round, int after_round, bool failed) {
  if (failed) etcd_.put(shared_->round_key(round, "failed"), "1");
  const std::string key = shared_->round_key(round, "node/" + shared_->options.node_name);
  const std::string value = str_cat(shared_->options.nproc_per_node, " ", after_round, " ", previous_rank_);
  try {
    etcd_.put(key, value, lease());
  } catch (const EtcdRefusedError& error) {
    if (std::string(error.what()).find("lease not found") == std::string::npos) throw;
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->lease = 0;  // expired while etcd was out of reach: a new one
    }
    etcd_.put(key, value, lease());
  }
}

// The running round (round - 1) is over when one of its nodes has entered
// this round, or when none of them is alive any more (they all finished or
// died: a job started again under the same --rdzv-id). New nodes alone wait.
bool EtcdRendezvous::running_round_over(int round, const RoundState& state) {
  if (round == 0) return true;
  for (const auto& entry : state.entries) {
    if (entry.previous_round == round - 1) return true;
  }
  const auto closed = etcd_.get(shared_->round_key(round - 1, "closed"));
  if (!closed) return true;
  const RoundState running = read_round(etcd_, *shared_, round - 1);
  for (const auto& name : parse_closed(closed->value).second) {
    if (has_entry(running, name)) return false;
  }
  return true;
}

// Closes `round` with its first MAX entries: the running round's nodes in
// their old order, then new ones by arrival. False when another node closed it first.
bool EtcdRendezvous::try_close(int round, const RoundState& state) {
  const Options& o = shared_->options;
  const size_t admitted = std::min(state.entries.size(), static_cast<size_t>(o.max_nodes));
  std::vector<std::tuple<int, int, int64_t, std::string>> order;  // (new, previous rank, arrival, name)
  for (size_t i = 0; i < admitted; ++i) {
    const Entry& e = state.entries[i];
    const bool was_running = e.previous_round == round - 1 && e.previous_round >= 0;
    order.emplace_back(was_running ? 0 : 1, was_running ? e.previous_rank : 0, e.arrived, e.name);
  }
  std::sort(order.begin(), order.end());
  int restarts = state.failed ? 1 : 0;
  if (round > 0) {
    if (auto previous = etcd_.get(shared_->round_key(round - 1, "closed"))) restarts += parse_closed(previous->value).first;
  }
  std::string text = std::to_string(restarts);
  for (const auto& entry : order) text += "\n" + std::get<3>(entry);
  return etcd_.create_all(shared_->round_key(round, "closed"),
                          {{shared_->round_key(round, "closed"), text}, {shared_->key("open"), std::to_string(round + 1)}});
}

// Node 0 of a round hosts its workers' store; the others read where it is.
// nullopt: not there yet (or node 0 is gone: then the round never starts).
std::optional<std::pair<std::string, int>> EtcdRendezvous::round_store(const Round& round, const RoundState& state) {
  if (round.group_rank == 0) {
    store_.reset();
    std::string host = shared_->settings.local_addr.empty() ? etcd_.local_address() : shared_->settings.local_addr;
    compat::TcpStoreSpec spec;
    spec.host = host;
    spec.port = 0;
    spec.is_server = true;
    spec.num_workers = round.nnodes * shared_->options.nproc_per_node;
    auto [server, port] = compat::make_tcp_store(spec);
    store_ = server;
    publish_job(store_, JobIdentity{shared_->settings.run_id, shared_->settings.token});
    etcd_.put(shared_->round_key(round.round, "store"), str_cat(host, " ", port), lease());
    return std::make_pair(host, port);
  }
  if (!state.store) return std::nullopt;
  std::istringstream fields(*state.store);
  std::pair<std::string, int> address;
  fields >> address.first >> address.second;
  return address;
}

JoinNext EtcdRendezvous::choose_round(JoinAttempt& join) {
  const auto open = etcd_.get(shared_->key("open"));
  join.round = std::max(join.after_round + 1, open ? std::atoi(open->value.c_str()) : 0);
  join.move(JoinAttempt::State::kEnter);
  return JoinNext::kNow;
}

JoinNext EtcdRendezvous::enter_round(JoinAttempt& join) {
  enter(join.round, join.after_round, join.failed);
  join.move(JoinAttempt::State::kWaitInRound);
  return JoinNext::kNow;
}

// Until the round closes: close it when enough nodes are in and the running
// round is over (at once with MAX nodes, else after the last call).
JoinNext EtcdRendezvous::wait_in_round(JoinAttempt& join) {
  const Options& o = shared_->options;
  const RoundState state = read_round(etcd_, *shared_, join.round);
  join.revision = state.revision;
  if (!state.closed) {
    if (!has_entry(state, o.node_name)) {  // this node's lease expired while it waited
      join.move(JoinAttempt::State::kEnter);
      return JoinNext::kNow;
    }
    const int entries = static_cast<int>(state.entries.size());
    if (entries < o.min_nodes || !running_round_over(join.round, state)) {
      join.ready_since.reset();
      return JoinNext::kWait;
    }
    if (!join.ready_since) join.ready_since = Clock::now();
    if (entries < o.max_nodes && Clock::now() - *join.ready_since < o.last_call_timeout) return JoinNext::kWait;
    try_close(join.round, state);  // or another node closed it first: read it again
    return JoinNext::kNow;
  }
  auto [restarts, names] = parse_closed(*state.closed);
  const auto me = std::find(names.begin(), names.end(), o.node_name);
  join.ready_since.reset();
  if (me == names.end()) {
    // Full, or closed before this node's entry was read: the next round.
    etcd_.erase(shared_->round_key(join.round, "node/" + o.node_name));
    ++join.round;
    join.move(JoinAttempt::State::kEnter);
    return JoinNext::kNow;
  }
  for (const auto& entry : state.entries) {
    LOCKSTEP_CHECK(entry.nproc == o.nproc_per_node, "lockstep run: node ", entry.name, " runs ", entry.nproc,
                   " workers and this node (", o.node_name, ") ", o.nproc_per_node,
                   ": every node of an elastic job needs the same --nproc-per-node");
  }
  Round admitted;
  admitted.round = join.round;
  admitted.group_rank = static_cast<int>(me - names.begin());
  admitted.nnodes = static_cast<int>(names.size());
  admitted.restarts = restarts;
  admitted.node_names = names;
  join.admitted = admitted;
  join.move(JoinAttempt::State::kAwaitStore);
  return JoinNext::kNow;
}

// Node 0 of the round publishes its workers' store; the others wait for it.
JoinNext EtcdRendezvous::await_store(JoinAttempt& join) {
  const RoundState state = read_round(etcd_, *shared_, join.round);
  join.revision = state.revision;
  if (auto store = round_store(*join.admitted, state)) {
    join.admitted->store_host = store->first;
    join.admitted->store_port = store->second;
    previous_rank_ = join.admitted->group_rank;
    join.move(JoinAttempt::State::kJoined);
    return JoinNext::kNow;
  }
  if (has_entry(state, join.admitted->node_names.front())) return JoinNext::kWait;
  // Node 0 died before it published the round's store: the round never starts.
  join.after_round = join.round;
  join.failed = true;
  join.round = -1;
  join.admitted.reset();
  join.move(JoinAttempt::State::kChooseRound);
  return JoinNext::kNow;
}

JoinNext EtcdRendezvous::run_state(JoinAttempt& join) {
  switch (join.state) {
    case JoinAttempt::State::kChooseRound: return choose_round(join);
    case JoinAttempt::State::kEnter: return enter_round(join);
    case JoinAttempt::State::kWaitInRound: return wait_in_round(join);
    case JoinAttempt::State::kAwaitStore: return await_store(join);
    case JoinAttempt::State::kJoined: break;
  }
  LOCKSTEP_ASSERT(false, "the etcd join ran a state after joined");
  return JoinNext::kWait;
}

std::optional<ElasticRendezvous::Round> EtcdRendezvous::join(int after_round, bool failed,
                                                             const std::function<bool()>& interrupted) {
  const Options& o = shared_->options;
  const auto deadline = Clock::now() + o.join_timeout;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->watched_round = -1;
    shared_->watched_names.clear();
    shared_->reason.clear();
  }
  JoinAttempt join;
  join.after_round = after_round;
  join.failed = failed;
  std::string last_error;
  while (true) {
    join.revision = 0;
    try {
      if (join.after_round < 0 && join.round < 0) forget_ended_run();
      fail_if_given_up();
      if (etcd_.get(shared_->key("finished"))) {
        finished_ = true;
        return std::nullopt;
      }
      if (run_state(join) == JoinNext::kNow) {
        if (join.state == JoinAttempt::State::kJoined) return join.admitted;
        continue;
      }
    } catch (const EtcdRefusedError& error) {
      LOCKSTEP_FAIL("lockstep run: node ", o.node_name, ": ", error.what());
    } catch (const EtcdError& error) {
      last_error = error.what();  // out of reach: tried again until the join timeout
    }
    if (interrupted()) return std::nullopt;
    LOCKSTEP_CHECK(Clock::now() < deadline, "lockstep run: node ", o.node_name, ": ",
                   last_error.empty() ? str_cat("no rendezvous round admitted this node (", o.min_nodes, " to ",
                                                o.max_nodes, " nodes; round ", join.round, ")")
                                      : last_error,
                   " within ", o.join_timeout.count() / 1000.0, " s (--join-timeout)");
    // Until something changes in the job's keys, the last call ends, or a second passes.
    milliseconds wait(1000);
    if (join.ready_since) {
      wait = std::clamp(std::chrono::duration_cast<milliseconds>(*join.ready_since + o.last_call_timeout - Clock::now()),
                        milliseconds(10), wait);
    }
    if (join.revision > 0 && last_error.empty()) {
      try {
        etcd_.watch_prefix(shared_->keys, join.revision, wait, interrupted);
      } catch (const EtcdError&) {
        std::this_thread::sleep_for(milliseconds(100));
      }
    } else {
      std::this_thread::sleep_for(milliseconds(200));
    }
    last_error.clear();
  }
}

void EtcdRendezvous::watch(const Round& round) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->watched_round = round.round;
  shared_->watched_names = round.node_names;
  shared_->reason.clear();
}

std::string EtcdRendezvous::restart_reason() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->reason;
}

void EtcdRendezvous::mark_finished() {
  try {
    etcd_.put(shared_->key("finished"), "1");
  } catch (const std::exception&) {
    // etcd is out of reach: the other nodes finish on their own.
  }
}

void EtcdRendezvous::abort(const std::string& why) {
  try {
    etcd_.put(shared_->key("abort"), why);
  } catch (const std::exception&) {
  }
}

}  // namespace

std::unique_ptr<ElasticRendezvous> make_etcd_rendezvous(ElasticRendezvous::Options options,
                                                        EtcdRendezvousSettings settings) {
  return std::make_unique<EtcdRendezvous>(std::move(options), std::move(settings));
}

}  // namespace lockstep
