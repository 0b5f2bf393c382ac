// A job's rendezvous rounds as etcd holds them, and the two threads an etcd
// rendezvous runs beside its launcher (Note [A rendezvous with no special
// node] in etcd_rendezvous.h): the lease keeper, which keeps this node's
// entries alive, and the watcher, which says when the running round should end.
//
//   auto shared = std::make_shared<etcd_rounds::EtcdShared>();   // options, settings, keys, stop
//   threads.start([shared] { etcd_rounds::keep_lease(shared); });
//   threads.start([shared] { etcd_rounds::watch_rounds(shared); });
//   const etcd_rounds::RoundState state = etcd_rounds::read_round(etcd, *shared, round);
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/launch/elastic_rendezvous.h"
#include "lockstep/launch/etcd_client.h"
#include "lockstep/launch/etcd_rendezvous.h"
#include "lockstep/launch/internal/background_threads.h"

namespace lockstep::etcd_rounds {

using std::chrono::milliseconds;

// What launchers share with the rendezvous's two threads (lease keeper, watcher).
struct EtcdShared {
  ElasticRendezvous::Options options;
  EtcdRendezvousSettings settings;
  std::string keys;  // the job's private prefix
  std::shared_ptr<StopSignal> stop;
  mutable std::mutex mutex;
  // Under mutex:
  int64_t lease = 0;  // 0: none yet, or expired
  int watched_round = -1;
  std::vector<std::string> watched_names;
  std::string reason;

  std::string key(const std::string& name) const { return keys + name; }
  std::string round_key(int round, const std::string& name) const { return str_cat(keys, "round/", round, "/", name); }
  bool pause(milliseconds period) { return stop->pause(period); }
};

// One node's entry in a round: round/<r>/node/<name> = "<nproc> <previous round> <previous rank>".
struct Entry {
  std::string name;
  int nproc = 0;
  int previous_round = -1;
  int previous_rank = -1;
  int64_t arrived = 0;  // create_revision: the order of arrival
};

// A round as etcd holds it.
struct RoundState {
  std::vector<Entry> entries;  // by arrival
  bool failed = false;
  std::optional<std::string> closed;
  std::optional<std::string> store;
  int64_t revision = 0;
};

// Every key of `round`, read at one revision.
RoundState read_round(EtcdClient& etcd, const EtcdShared& shared, int round);
// A closed round's record "<restarts>\nname\nname..." -> restarts, names.
std::pair<int, std::vector<std::string>> parse_closed(const std::string& text);
bool has_entry(const RoundState& state, const std::string& name);

// The two threads' bodies; each returns when shared->stop is raised.
void keep_lease(const std::shared_ptr<EtcdShared>& shared);
void watch_rounds(const std::shared_ptr<EtcdShared>& shared);

}  // namespace lockstep::etcd_rounds
