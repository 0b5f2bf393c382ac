#include "lockstep/dist/internal/polling_store.h"

#include <algorithm>
#include <thread>

#include "lockstep/core/error.h"
#include "lockstep/dist/work.h"

namespace lockstep {
namespace {

// Note [Waiting without holding the store]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A c10d TCPStore client serialises its operations under one lock, and its
// `get` and `wait` hold that lock until the key appears. Every group of a
// process shares one client (the job store), and groups can be built from two
// threads at once: the trainer's metrics writer builds the metrics group on
// its thread while the main thread builds the side group for an evaluation.
// Gloo's key exchange sets this rank's address and then waits for each peer's.
// On two ranks this deadlocks: rank 0's metrics thread waits for rank 1's
// metrics key holding rank 0's client, so rank 0's main thread cannot set its
// side key; rank 1's main thread waits for that side key holding rank 1's
// client, so rank 1's metrics thread cannot set the metrics key rank 0 waits
// for. Each waits out the full timeout (DistributedRun.AsyncMetrics... failed
// this way on libtorch 2.6, and could on 1.13).
//
// Subgroups therefore exchange keys through this view: a wait is a loop of
// `check` calls, each holding the client for one round trip, with a pause
// that doubles from 1 ms to 20 ms between them. The world group, built before
// any other thread exists, keeps the blocking wait, which costs the store no
// polling at 128 ranks. PyTorch 2.7 meets the same problem with Store::clone()
// (a connection per thread); 2.6 and 1.13 have no clone.
class PollingStore : public compat::StoreBase {
 public:
  PollingStore(c10::intrusive_ptr<compat::C10dStore> store, std::chrono::milliseconds timeout, std::string where)
      : compat::StoreBase(timeout), store_(std::move(store)), where_(std::move(where)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_->set(key, value); }

  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                  const std::vector<uint8_t>& desired) override {
    return store_->compareSet(key, current, desired);
  }

  std::vector<uint8_t> get(const std::string& key) override {
    wait({key}, timeout_);
    return store_->get(key);
  }

  int64_t add(const std::string& key, int64_t value) override { return store_->add(key, value); }
  bool deleteKey(const std::string& key) override { return store_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return store_->check(keys); }
  int64_t getNumKeys() override { return store_->getNumKeys(); }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    // c10d's kNoTimeout (0) means "forever"; lockstep never waits forever.
    const auto limit = timeout.count() > 0 ? timeout : timeout_;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    auto pause = std::chrono::milliseconds(1);
    while (!store_->check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string names;
        for (const auto& key : keys) names += (names.empty() ? "" : ", ") + key;
        throw TimeoutError(str_cat("wait timeout after ", detail::format_duration(limit), " in ", where_,
                                   " for keys [", names, "]"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
  }

 protected:
  c10::intrusive_ptr<compat::C10dStore> clone_store() override {
    return c10::make_intrusive<PollingStore>(compat::clone_store(store_), timeout_, where_);
  }

 private:
  c10::intrusive_ptr<compat::C10dStore> store_;
  std::string where_;
};

}  // namespace

c10::intrusive_ptr<compat::C10dStore> make_polling_store(c10::intrusive_ptr<compat::C10dStore> store,
                                                         std::chrono::milliseconds timeout, std::string where) {
  return c10::make_intrusive<PollingStore>(std::move(store), timeout, std::move(where));
}

}  // namespace lockstep
