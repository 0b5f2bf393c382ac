#include "lockstep/comm/work.h"

#include <condition_variable>
#include <list>
#include <mutex>
#include <sstream>
#include <thread>

#include "lockstep/comm/process_group.h"

namespace lockstep {
namespace detail {

namespace {

// Publishes "I have entered collective #N" for collectives that have been
// pending for a while, from one background thread per process, so that the
// fast path never touches the store. The rank whose wait runs out reads these
// keys to tell which peers never arrived.
class ArrivalBoard {
 public:
  static ArrivalBoard& instance() {
    // Leaked on purpose: the thread must not be joined during static destruction.
    static ArrivalBoard* board = new ArrivalBoard();
    return *board;
  }

  long long add(c10::intrusive_ptr<compat::C10dStore> store, std::string key, std::chrono::milliseconds timeout) {
    auto now = std::chrono::steady_clock::now();
    auto delay = arrival_publish_delay(timeout);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_started_) {
      thread_started_ = true;
      std::thread([this] { loop(); }).detach();
    }
    long long id = ++next_id_;
    entries_.push_back(Entry{id, std::move(store), std::move(key), now + delay});
    return id;
  }

  void remove(long long id) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->id == id) {
        entries_.erase(it);
        return;
      }
    }
  }

 private:
  struct Entry {
    long long id;
    c10::intrusive_ptr<compat::C10dStore> store;
    std::string key;
    std::chrono::steady_clock::time_point publish_at;
    bool published = false;
  };

  void loop() {
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::vector<std::pair<c10::intrusive_ptr<compat::C10dStore>, std::string>> due;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto now = std::chrono::steady_clock::now();
        for (auto& entry : entries_) {
          if (!entry.published && entry.publish_at <= now) {
            entry.published = true;
            due.emplace_back(entry.store, entry.key);
          }
        }
      }
      for (auto& [store, key] : due) {
        try {
          store->set(key, std::vector<uint8_t>{'1'});
        } catch (const std::exception&) {
          // The store's host may be gone; the timeout path reports what it can.
        }
      }
    }
  }

  std::mutex mutex_;
  std::list<Entry> entries_;
  long long next_id_ = 0;
  bool thread_started_ = false;
};

}  // namespace

ArrivalToken::ArrivalToken(c10::intrusive_ptr<compat::C10dStore> store, std::string key,
                           std::chrono::milliseconds timeout)
    : id_(ArrivalBoard::instance().add(std::move(store), std::move(key), timeout)) {}

ArrivalToken::~ArrivalToken() { release(); }

void ArrivalToken::release() {
  if (id_ != 0) ArrivalBoard::instance().remove(id_);
  id_ = 0;
}

// Publish well before the peers' timeouts fire, but not for every short op.
std::chrono::milliseconds arrival_publish_delay(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::milliseconds>(timeout / 4, std::chrono::seconds(2));
}

std::string arrival_key(long long seq, int group_rank) {
  return "arrived/" + std::to_string(seq) + "/" + std::to_string(group_rank);
}

std::string format_duration(std::chrono::milliseconds duration) {
  auto ms = duration.count();
  if (ms % 1000 == 0) return str_cat(ms / 1000, "s");
  std::ostringstream out;
  out << static_cast<double>(ms) / 1000.0 << "s";
  return out.str();
}

}  // namespace detail

Work::Work(std::shared_ptr<const ProcessGroup> group, detail::OpInfo info)
    : group_(std::move(group)), info_(std::move(info)) {
  if (info_.seq > 0 && group_->size() > 1) {
    arrival_ = std::make_unique<detail::ArrivalToken>(group_->store(), detail::arrival_key(info_.seq, group_->rank()),
                                                      info_.timeout);
  }
}

Work::~Work() = default;

std::string Work::description() const {
  std::string what = info_.seq > 0 ? str_cat(info_.name, " #", info_.seq) : info_.name;
  return str_cat(what, " on group '", group_->name(), "' (", group_->size(), " ranks)");
}

void Work::wait() { wait(info_.timeout); }

void Work::wait(std::chrono::milliseconds timeout) {
  if (error_) std::rethrow_exception(error_);
  if (done_) return;
  try {
    if (has_future_) {
      if (future_.wait_for(timeout) != std::future_status::ready) fail_timeout(timeout);
      future_.get();
    } else {
      auto deadline = std::chrono::steady_clock::now() + timeout;
      for (auto& raw : raw_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (!compat::wait_work(*raw, std::max(left, std::chrono::milliseconds(1)))) fail_timeout(timeout);
      }
    }
    complete();
  } catch (const TimeoutError&) {
    error_ = std::current_exception();
    throw;
  } catch (const detail::StepTimeout&) {
    try {
      fail_timeout(timeout);
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  } catch (const std::exception& error) {
    if (error_) throw;
    try {
      fail(error);
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  }
}

bool Work::is_completed() {
  if (done_ || error_) return true;
  if (has_future_) return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  for (auto& raw : raw_) {
    if (!raw->isCompleted()) return false;
  }
  return true;
}

void Work::complete() {
  raw_.clear();
  if (arrival_) arrival_->release();
  if (finish_) {
    auto finish = std::move(finish_);
    finish_ = nullptr;
    finish();
  }
  done_ = true;
}

std::vector<int> Work::late_peers() const {
  std::vector<int> late;
  if (info_.seq == 0) return info_.peers;  // point-to-point: the one peer
  const auto& store = group_->store();
  try {
    store->set(detail::arrival_key(info_.seq, group_->rank()), std::vector<uint8_t>{'1'});
    for (int peer : info_.peers) {
      if (!store->check({detail::arrival_key(info_.seq, peer)})) late.push_back(peer);
    }
  } catch (const std::exception&) {
    return info_.peers;  // the store is unreachable: name every peer of the op
  }
  return late;
}

std::vector<int> Work::late_world_peers() const {
  std::vector<int> late_world;
  for (int peer : late_peers()) late_world.push_back(group_->global_rank(peer));
  return late_world;
}

void Work::fail_timeout(std::chrono::milliseconds waited) {
  auto late_world = late_world_peers();
  std::string waiting;
  if (!late_world.empty()) {
    waiting = str_cat(" waiting for ranks ", format_ranks(late_world));
  } else {
    std::vector<int> all;
    for (int peer : info_.peers) all.push_back(group_->global_rank(peer));
    waiting = str_cat(" (ranks ", format_ranks(all), " had all entered it; the transfer itself stalled)");
  }
  throw TimeoutError(str_cat("rank ", group_->global_rank(group_->rank()), ": ", description(), " timed out after ",
                             detail::format_duration(waited), waiting));
}

void Work::fail(const std::exception& error) {
  std::string message = short_torch_message(error);
  const bool connection_lost = message.find("Connection closed") != std::string::npos ||
                               message.find("Connection reset") != std::string::npos ||
                               message.find("Broken pipe") != std::string::npos;
  // Note [A lost peer that never arrived]: a rank that times out in one
  // collective closes its connections (Gloo's pairs are shared by a group's
  // views and side channels), so its peers waiting in another collective fail
  // at once with a closed connection instead of timing out. Once this rank
  // has waited long enough for arrivals to be published (twice the delay,
  // for the publisher's 100 ms cycle and the store's round trip), the store
  // tells whether those peers ever entered this collective: if they did not,
  // the ranks were at different points, as a timeout would have said.
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - issued_);
  if (connection_lost && info_.seq > 0 && waited >= 2 * detail::arrival_publish_delay(info_.timeout)) {
    auto late_world = late_world_peers();
    if (!late_world.empty()) {
      throw PeerLostError(str_cat("rank ", group_->global_rank(group_->rank()), ": ", description(), " failed after ",
                                  detail::format_duration(waited), " waiting for ranks ", format_ranks(late_world),
                                  ", which never entered it and closed their connections (", message,
                                  "; a rank closes them when it times out in another collective or exits)"));
    }
  }
  std::string hint = connection_lost ? " (a peer process probably exited)" : "";
  throw DistributedError(str_cat("rank ", group_->global_rank(group_->rank()), ": ", description(), " failed: ", message, hint));
}

}  // namespace lockstep
