#include "lockstep/launch/restart_rounds.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "lockstep/compat/c10d.h"
#include "lockstep/core/error.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/launch/store_client.h"

namespace lockstep {

using Clock = std::chrono::steady_clock;

struct RestartRounds::Shared {
  std::string host;
  int port = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::chrono::milliseconds join_timeout{0};
  std::atomic<int> watched{-1};
  std::atomic<int> waiting{-1};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable wake;
  bool watcher_done = false;

  // A store operation is given this long before its connection is dropped and
  // a new one tried (c10d counts connect timeouts in whole seconds: at least 1 s).
  std::chrono::milliseconds operation_timeout() const {
    return std::clamp<std::chrono::milliseconds>(join_timeout / 4, std::chrono::seconds(1), std::chrono::seconds(10));
  }

  c10::intrusive_ptr<compat::C10dStore> connect() const { return connect_store(host, port, operation_timeout()); }

  static std::string key(int round, int node) {
    return str_cat("lockstep/launch/round/", round, "/node/", node);
  }
};

namespace {

void watch_loop(const std::shared_ptr<RestartRounds::Shared>& shared) {
  c10::intrusive_ptr<compat::C10dStore> store;
  while (!shared->stop) {
    const int round = shared->watched;
    if (round >= 0 && shared->waiting < 0) {
      try {
        if (!store) store = shared->connect();
        for (int node = 0; node < shared->nnodes; ++node) {
          if (node == shared->node_rank || !store->check({RestartRounds::Shared::key(round + 1, node)})) continue;
          if (shared->watched == round) shared->waiting = node;
          break;
        }
      } catch (const std::exception&) {
        store.reset();  // node 0 unreachable for now: try again on a new connection
      }
    }
    std::unique_lock<std::mutex> lock(shared->mutex);
    shared->wake.wait_for(lock, std::chrono::milliseconds(200), [&] { return shared->stop.load(); });
  }
  std::lock_guard<std::mutex> lock(shared->mutex);
  shared->watcher_done = true;
  shared->wake.notify_all();
}

}  // namespace

RestartRounds::RestartRounds(std::string host, int port, int nnodes, int node_rank,
                             std::chrono::milliseconds join_timeout)
    : shared_(std::make_shared<Shared>()) {
  shared_->host = std::move(host);
  shared_->port = port;
  shared_->nnodes = nnodes;
  shared_->node_rank = node_rank;
  shared_->join_timeout = join_timeout;
  watcher_ = std::thread([shared = shared_] { watch_loop(shared); });
}

RestartRounds::~RestartRounds() {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->stop = true;
  shared_->wake.notify_all();
  // A watcher stuck on an unreachable node 0 is left to the end of the process.
  const bool done = shared_->wake.wait_for(lock, std::chrono::seconds(1), [&] { return shared_->watcher_done; });
  lock.unlock();
  if (done) {
    watcher_.join();
  } else {
    watcher_.detach();
  }
}

void RestartRounds::watch(int round) {
  shared_->waiting = -1;
  shared_->watched = round;
}

int RestartRounds::node_waiting() const { return shared_->waiting; }

bool RestartRounds::enter(int round, const std::function<bool()>& interrupted) {
  const auto deadline = Clock::now() + shared_->join_timeout;
  c10::intrusive_ptr<compat::C10dStore> store;
  bool announced = false;
  std::vector<int> missing;
  std::string last_error;
  while (true) {
    try {
      if (!store) store = shared_->connect();
      if (!announced) {
        store->set(Shared::key(round, shared_->node_rank), std::vector<uint8_t>{'1'});
        announced = true;
      }
      missing.clear();
      for (int node = 0; node < shared_->nnodes; ++node) {
        if (!store->check({Shared::key(round, node)})) missing.push_back(node);
      }
      if (missing.empty()) return true;
    } catch (const std::exception& error) {
      store.reset();
      last_error = short_torch_message(error);
    }
    if (interrupted()) return false;
    LOCKSTEP_CHECK(Clock::now() < deadline, "node ", shared_->node_rank, ": restart ", round, ": ",
                   announced ? str_cat("nodes ", format_ranks(missing), " did not join it")
                             : str_cat("node 0's store at ", shared_->host, ":", shared_->port, " is unreachable (",
                                       last_error, ")"),
                   " within ", shared_->join_timeout.count() / 1000.0, " s (--join-timeout)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace lockstep
