#include "lockstep/launch/internal/etcd_rounds.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::etcd_rounds {
namespace {

// Why the watched round should end, from what etcd holds now ("" if it should not).
std::string round_over(EtcdClient& etcd, EtcdShared& shared, int round, const std::vector<std::string>& names,
                       int64_t& revision) {
  if (etcd.get(shared.key("finished"))) return "";  // nodes that finished leave; the others finish too
  const RoundState running = read_round(etcd, shared, round);
  const RoundState next = read_round(etcd, shared, round + 1);
  revision = std::max(running.revision, next.revision);
  for (const auto& name : names) {
    if (!has_entry(running, name)) {
      // A lost node is a failure: the next round counts as a restart, as when its workers fail.
      etcd.put(shared.round_key(round + 1, "failed"), "1");
      return str_cat("node ", name, " left the job (its etcd lease expired)");
    }
  }
  if (next.failed) return "another node's workers failed";
  const int waiting = static_cast<int>(next.entries.size());
  if (waiting > 0 && static_cast<int>(names.size()) < shared.options.max_nodes) {
    return str_cat(waiting, " node", waiting > 1 ? "s" : "", " asked to join");
  }
  return "";
}

}  // namespace

RoundState read_round(EtcdClient& etcd, const EtcdShared& shared, int round) {
  RoundState state;
  const std::string prefix = shared.round_key(round, "");
  for (const auto& kv : etcd.get_prefix(prefix, &state.revision)) {
    const std::string name = kv.key.substr(prefix.size());
    if (name.rfind("node/", 0) == 0) {
      Entry entry;
      entry.name = name.substr(5);
      entry.arrived = kv.create_revision;
      std::istringstream fields(kv.value);
      fields >> entry.nproc >> entry.previous_round >> entry.previous_rank;
      if (!fields.fail()) state.entries.push_back(entry);  // anything else is not a lockstep node's
    } else if (name == "failed") {
      state.failed = true;
    } else if (name == "closed") {
      state.closed = kv.value;
    } else if (name == "store") {
      state.store = kv.value;
    }
  }
  std::sort(state.entries.begin(), state.entries.end(),
            [](const Entry& a, const Entry& b) { return a.arrived < b.arrived; });
  return state;
}

// "<restarts>\nname\nname..." -> restarts, names.
std::pair<int, std::vector<std::string>> parse_closed(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  int restarts = 0;
  if (std::getline(lines, line)) restarts = std::atoi(line.c_str());
  std::vector<std::string> names;
  while (std::getline(lines, line)) {
    if (!line.empty()) names.push_back(line);
  }
  return {restarts, names};
}

bool has_entry(const RoundState& state, const std::string& name) {
  return std::any_of(state.entries.begin(), state.entries.end(), [&](const Entry& e) { return e.name == name; });
}

// Keeps this launcher's lease alive; a lease that expired anyway (etcd was
// unreachable for longer than its TTL) ends the running round, since every
// entry made with it is gone.
void keep_lease(const std::shared_ptr<EtcdShared>& shared) {
  EtcdClient etcd(shared->settings.etcd);
  const milliseconds period = std::chrono::duration_cast<milliseconds>(shared->settings.lease_ttl) / 3;
  while (shared->pause(period)) {
    int64_t lease = 0;
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      lease = shared->lease;
    }
    if (lease == 0) continue;
    bool alive = true;
    try {
      alive = etcd.keep_alive(lease);
    } catch (const EtcdRefusedError&) {
      alive = false;  // etcd no longer knows the lease
    } catch (const EtcdError&) {
      // Out of reach: tried again next period.
    }
    if (alive) continue;
    std::lock_guard<std::mutex> lock(shared->mutex);
    if (shared->lease != lease) continue;
    shared->lease = 0;
    if (shared->watched_round >= 0 && shared->reason.empty()) {
      shared->reason = "this node's etcd lease expired (etcd was out of reach for longer than lease_ttl)";
    }
  }
}

// Every admitted node: should the running round end?
void watch_rounds(const std::shared_ptr<EtcdShared>& shared) {
  EtcdClient etcd(shared->settings.etcd);
  while (!shared->stop->raised()) {
    int round = -1;
    std::vector<std::string> names;
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      if (shared->reason.empty()) {
        round = shared->watched_round;
        names = shared->watched_names;
      }
    }
    if (round >= 0) {
      try {
        int64_t revision = 0;
        const std::string reason = round_over(etcd, *shared, round, names, revision);
        if (!reason.empty()) {
          std::lock_guard<std::mutex> lock(shared->mutex);
          if (shared->watched_round == round) shared->reason = reason;
          continue;
        }
        const auto moved_on = [&] {
          std::lock_guard<std::mutex> lock(shared->mutex);
          return shared->stop->raised() || shared->watched_round != round;
        };
        etcd.watch_prefix(shared->keys, revision, std::chrono::seconds(5), moved_on);
        continue;
      } catch (const std::exception&) {
        // etcd is out of reach for now: the lease keeper and the workers will tell.
      }
    }
    if (!shared->pause(milliseconds(200))) break;
  }
}

}  // namespace lockstep::etcd_rounds
