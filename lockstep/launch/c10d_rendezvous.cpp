#include "lockstep/launch/c10d_rendezvous.h"

#include <algorithm>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include <c10/macros/Macros.h>

#include "lockstep/compat/c10d.h"
#include "lockstep/core/error.h"
#include "lockstep/launch/internal/background_threads.h"
#include "lockstep/launch/store_client.h"

namespace lockstep {

using Clock = std::chrono::steady_clock;
using StorePtr = c10::intrusive_ptr<compat::C10dStore>;

namespace {

class C10dRendezvous : public ElasticRendezvous {
 public:
  C10dRendezvous(Options options, bool coordinator);
  ~C10dRendezvous() override;
  C10_DISABLE_COPY_AND_ASSIGN(C10dRendezvous);

  std::optional<Round> join(int after_round, bool failed, const std::function<bool()>& interrupted) override;
  void watch(const Round& round) override;
  std::string restart_reason() const override;
  void mark_finished() override;
  void abort(const std::string& why) override;
  std::string where() const override;

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  BackgroundThreads threads_;  // the watcher; the coordinator's loop where this node hosts the store
};

}  // namespace

struct C10dRendezvous::Shared {
  Options options;
  std::shared_ptr<StopSignal> stop;
  std::mutex mutex;
  // What the watcher reports (under mutex).
  int watched_round = -1;
  int watched_nnodes = 0;
  std::string reason;

  StorePtr connect() const {
    return connect_store(options.host, options.port, std::clamp<std::chrono::milliseconds>(
                                                         options.join_timeout / 4, std::chrono::seconds(1),
                                                         std::chrono::seconds(10)));
  }
  // Sleeps up to `period`; false when the rendezvous is being destroyed.
  bool pause(std::chrono::milliseconds period) { return stop->pause(period); }
};

namespace {

constexpr const char* kPrefix = "lockstep/elastic/";

std::string key(const std::string& name) { return kPrefix + name; }
std::string round_key(int round, const std::string& name) { return str_cat(kPrefix, "round/", round, "/", name); }

std::string get_text(const StorePtr& store, const std::string& k) {
  const std::vector<uint8_t> bytes = store->get(k);
  return std::string(bytes.begin(), bytes.end());
}
void set_text(const StorePtr& store, const std::string& k, const std::string& value) {
  store->set(k, std::vector<uint8_t>(value.begin(), value.end()));
}

// The coordinator: closes round after round, for as long as the launcher lives.
void coordinate(const std::shared_ptr<C10dRendezvous::Shared>& shared) {
  const auto& o = shared->options;
  StorePtr store;
  int round = 0, restarts = 0;
  bool opened = false;
  Clock::time_point ready_since{};  // when the round became ready to close (`ready`)
  bool ready = false;
  while (!shared->stop->raised()) {
    try {
      if (!store) store = shared->connect();
      if (!opened) {
        set_text(store, key("open"), std::to_string(round));
        opened = true;
      }
      const int count = static_cast<int>(store->add(round_key(round, "count"), 0));
      // A round after the first closes only once the running round is ending:
      // one of its nodes holds a ticket. New nodes alone wait for that.
      bool running_round_ended = round == 0;
      for (int ticket = 0; ticket < count && !running_round_ended; ++ticket) {
        const std::string k = round_key(round, str_cat("node/", ticket));
        if (!store->check({k})) continue;
        std::istringstream fields(get_text(store, k));
        int nproc = 0, previous = -1;
        fields >> nproc >> previous;  // (then the previous rank and the name)
        running_round_ended = previous == round - 1;
      }
      if (count >= o.min_nodes && running_round_ended) {
        if (!ready) ready_since = Clock::now();
        ready = true;
        if (count >= o.max_nodes || Clock::now() - ready_since >= o.last_call_timeout) {
          const int admitted = std::min(count, o.max_nodes);
          if (store->check({round_key(round, "failed")})) ++restarts;
          set_text(store, round_key(round, "closed"), str_cat(admitted, " ", restarts));
          ++round;
          opened = false;
          ready = false;
          continue;
        }
      } else {
        ready = false;
      }
    } catch (const std::exception&) {
      store.reset();
    }
    if (!shared->pause(std::chrono::milliseconds(100))) break;
  }
}

// Every admitted node: is someone waiting in the round after the watched one?
void watch_next_round(const std::shared_ptr<C10dRendezvous::Shared>& shared) {
  StorePtr store;
  while (!shared->stop->raised()) {
    int round = -1, nnodes = 0;
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      if (shared->reason.empty()) {
        round = shared->watched_round;
        nnodes = shared->watched_nnodes;
      }
    }
    if (round >= 0) {
      try {
        if (!store) store = shared->connect();
        std::string reason;
        if (store->check({round_key(round + 1, "failed")})) {
          reason = "another node's workers failed";
        } else if (nnodes < shared->options.max_nodes) {
          const int64_t waiting = store->add(round_key(round + 1, "count"), 0);
          if (waiting > 0) reason = str_cat(waiting, " node", waiting > 1 ? "s" : "", " asked to join");
        }
        if (!reason.empty()) {
          std::lock_guard<std::mutex> lock(shared->mutex);
          if (shared->watched_round == round) shared->reason = reason;
        }
      } catch (const std::exception&) {
        store.reset();  // the coordinator is unreachable for now: the workers will tell
      }
    }
    if (!shared->pause(std::chrono::milliseconds(200))) break;
  }
}

}  // namespace

C10dRendezvous::C10dRendezvous(Options options, bool coordinator) : shared_(std::make_shared<Shared>()) {
  LOCKSTEP_CHECK(options.min_nodes >= 1 && options.min_nodes <= options.max_nodes, "lockstep run: --nnodes ",
                 options.min_nodes, ":", options.max_nodes, " needs 1 <= MIN <= MAX");
  shared_->options = std::move(options);
  shared_->stop = threads_.stop_signal();
  threads_.start([shared = shared_] { watch_next_round(shared); });
  if (coordinator) threads_.start([shared = shared_] { coordinate(shared); });
}

C10dRendezvous::~C10dRendezvous() = default;

std::optional<ElasticRendezvous::Round> C10dRendezvous::join(int after_round, bool failed,
                                                                const std::function<bool()>& interrupted) {
  const Options& o = shared_->options;
  const auto deadline = Clock::now() + o.join_timeout;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->watched_round = -1;
    shared_->reason.clear();
  }
  StorePtr store;
  int round = after_round >= 0 ? after_round + 1 : -1;
  int ticket = -1;
  std::string last_error;
  while (true) {
    try {
      if (!store) store = shared_->connect();
      if (store->check({key("abort")})) LOCKSTEP_FAIL("lockstep run: the job was given up: ", get_text(store, key("abort")));
      if (store->check({key("finished")})) {
        finished_ = true;
        return std::nullopt;
      }
      if (round < 0 && store->check({key("open")})) round = std::stoi(get_text(store, key("open")));
      if (round >= 0 && ticket < 0) {
        if (failed) set_text(store, round_key(round, "failed"), "1");
        ticket = static_cast<int>(store->add(round_key(round, "count"), 1)) - 1;
        set_text(store, round_key(round, str_cat("node/", ticket)),
                 str_cat(o.nproc_per_node, " ", after_round, " ", previous_rank_, " ", o.node_name));
      }
      if (ticket >= 0 && store->check({round_key(round, "closed")})) {
        std::istringstream closed(get_text(store, round_key(round, "closed")));
        Round result;
        closed >> result.nnodes >> result.restarts;
        if (ticket < result.nnodes) {
          result.round = round;
          // Nodes of the previous round keep their order; new ones follow by ticket.
          std::vector<std::tuple<int, int, int, std::string>> order;  // (new, previous rank, ticket, name)
          for (int node = 0; node < result.nnodes; ++node) {
            const std::string k = round_key(round, str_cat("node/", node));
            store->wait({k}, o.join_timeout);
            std::istringstream fields(get_text(store, k));
            int nproc = 0, previous = -1, previous_rank = -1;
            std::string name;
            fields >> nproc >> previous >> previous_rank;
            std::getline(fields >> std::ws, name);
            LOCKSTEP_CHECK(nproc == o.nproc_per_node, "lockstep run: node ", name, " runs ", nproc,
                           " workers and this node (", o.node_name, ") ", o.nproc_per_node,
                           ": every node of an elastic job needs the same --nproc-per-node");
            const bool was_running = previous == round - 1 && previous >= 0;
            order.emplace_back(was_running ? 0 : 1, was_running ? previous_rank : 0, node, name);
          }
          std::sort(order.begin(), order.end());
          for (size_t rank = 0; rank < order.size(); ++rank) {
            if (std::get<2>(order[rank]) == ticket) result.group_rank = static_cast<int>(rank);
            result.node_names.push_back(std::get<3>(order[rank]));
          }
          previous_rank_ = result.group_rank;
          result.store_host = o.host;
          result.store_port = o.port;
          return result;
        }
        ++round;  // the round was full: wait in the next one
        ticket = -1;
        continue;
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& error) {
      store.reset();
      last_error = short_torch_message(error);
    }
    if (interrupted()) return std::nullopt;
    LOCKSTEP_CHECK(Clock::now() < deadline, "lockstep run: node ", o.node_name, ": ",
                   store ? str_cat("no rendezvous round admitted this node (", o.min_nodes, " to ", o.max_nodes,
                                   " nodes; round ", round, ")")
                         : str_cat("the rendezvous store at ", o.host, ":", o.port, " is unreachable (", last_error,
                                   ")"),
                   " within ", o.join_timeout.count() / 1000.0, " s (--join-timeout)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void C10dRendezvous::watch(const Round& round) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->watched_round = round.round;
  shared_->watched_nnodes = round.nnodes;
  shared_->reason.clear();
}

std::string C10dRendezvous::restart_reason() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->reason;
}

namespace {
void set_flag(const C10dRendezvous::Shared& shared, const std::string& k, const std::string& value) {
  try {
    set_text(connect_store(shared.options.host, shared.options.port, std::chrono::seconds(1)), k, value);
  } catch (const std::exception&) {
    // The store is gone with its host: nobody is left to tell.
  }
}
}  // namespace

void C10dRendezvous::mark_finished() { set_flag(*shared_, key("finished"), "1"); }

void C10dRendezvous::abort(const std::string& why) { set_flag(*shared_, key("abort"), why); }

std::string C10dRendezvous::where() const {
  return str_cat("the rendezvous at ", shared_->options.host, ":", shared_->options.port);
}

std::unique_ptr<ElasticRendezvous> make_c10d_rendezvous(ElasticRendezvous::Options options, bool coordinator) {
  return std::make_unique<C10dRendezvous>(std::move(options), coordinator);
}

}  // namespace lockstep
