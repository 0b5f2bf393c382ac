#include "lockstep/comm/internal/store_views.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "lockstep/compat/internal/gloo_addresses.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/open_files.h"
#include "lockstep/comm/work.h"

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
// that doubles from 1 ms to 20 ms between them. The world group, and the
// node groups built while the world is set up (under BlockingStoreWaits),
// come before any other thread exists and keep the blocking wait, which costs
// the store no polling at 128 ranks. PyTorch 2.7 meets the same problem with
// Store::clone() (a connection per thread); 2.6 and 1.13 have no clone.
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

thread_local bool blocking_store_waits = false;

// Note [One table of Gloo addresses]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Gloo builds its full mesh through the store. Each rank sets one key with
// its addresses ("<device>/<rank>"; the Gloo of libtorch 1.13 also sets
// "<device>/rank_<rank>" with its host name, which every higher rank reads),
// then waits for and gets every other rank's key: 2 (N - 1) operations per
// rank, 2 N^2 on the store's one thread (2 x 10^6 at 1,000 ranks). A TCPStore
// has no call that reads many keys before libtorch 2.3, so through this view
// each family of such keys travels as one table:
//   - rank 0, setting its own key of a family, waits for the family's other
//     N - 1 keys in one call, gets them, and publishes all N values under
//     "<family>table" (N + 1 operations; its own key never reaches the store;
//     the addresses go to each reader apart, Note [Each rank reads its own
//     part], 2 N - 1 operations);
//   - every other rank sets its key, and at its first read of the family waits
//     for its table and gets it (3 operations), then answers Gloo's reads of
//     the family from it.
// Rank 0's set returns only once every rank has set its key. That cannot
// deadlock: both Gloo versions here set a rank's own key of a family before
// they read any key of it, and the host-name family is complete before any
// rank sets an address. Keys of another shape, and a family read before this
// rank set its own key (no Gloo does that), pass through unchanged.
//
// Note [Each rank reads its own part]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A table of whole values would still send every rank every rank's value,
// and each value holds something for every peer: libtorch 1.13's Gloo puts
// N - 1 addresses of 136 bytes in it (0.5 MB read per rank at 64 ranks, 136
// MB at 1,000, 136 GB through the store in all), 2.x's Gloo N pair numbers
// of 8 bytes. Each peer reads one of them. So the address family (keys
// "<prefix>/<rank>") travels as one table per reader: rank 0 recognises the
// values' format (compat/internal/gloo_addresses.h: checked field by field,
// the whole values when it is not recognised), cuts from each value the part
// the reader reads, and sets "<prefix>/table/<reader>"; the reader waits for
// and gets its own table (still 3 operations) and hands Gloo, for each peer,
// a value where the bytes it reads are that peer's and the rest are zero.
// Per rank that is O(N) bytes; rank 0 makes N - 1 more sets. The host-name
// family is read whole and stays one shared table.
class AddressTableStore : public compat::StoreBase {
 public:
  AddressTableStore(c10::intrusive_ptr<compat::C10dStore> store, int rank, int size, std::chrono::milliseconds timeout)
      : compat::StoreBase(timeout), store_(std::move(store)), rank_(rank), size_(size) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    const auto member = family_member(key);
    if (!member || member->second != rank_) return store_->set(key, value);
    std::lock_guard<std::mutex> lock(mutex_);
    Family& family = families_[member->first];
    family.own = value;
    if (rank_ != 0) return store_->set(key, value);
    publish_table(member->first, family);
  }

  std::vector<uint8_t> get(const std::string& key) override {
    const auto member = family_member(key);
    if (!member) return store_->get(key);
    std::lock_guard<std::mutex> lock(mutex_);
    const Family* family = ready_family(member->first, timeout_);
    if (!family) return store_->get(key);
    const int owner = member->second;
    if (owner == rank_) return *family->own;
    return compat::gloo_address_from_part(family->format, (*family->table)[static_cast<size_t>(owner)], owner, rank_,
                                          size_);
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> others;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& key : keys) {
        const auto member = family_member(key);
        if (!member || !ready_family(member->first, timeout)) others.push_back(key);
      }
    }
    if (!others.empty()) store_->wait(others, timeout);
  }

  bool check(const std::vector<std::string>& keys) override {
    std::vector<std::string> others;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& key : keys) {
        const auto member = family_member(key);
        const auto found = member ? families_.find(member->first) : families_.end();
        if (found == families_.end() || !found->second.table) others.push_back(key);
      }
    }
    return others.empty() || store_->check(others);
  }

  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                  const std::vector<uint8_t>& desired) override {
    return store_->compareSet(key, current, desired);
  }
  int64_t add(const std::string& key, int64_t value) override { return store_->add(key, value); }
  bool deleteKey(const std::string& key) override { return store_->deleteKey(key); }
  int64_t getNumKeys() override { return store_->getNumKeys(); }

 protected:
  c10::intrusive_ptr<compat::C10dStore> clone_store() override {
    return c10::make_intrusive<AddressTableStore>(compat::clone_store(store_), rank_, size_, timeout_);
  }

 private:
  struct Family {
    std::optional<std::vector<uint8_t>> own;  // this rank's value, once set
    // By rank: on rank 0 every rank's value; elsewhere the part of each this
    // rank reads, in `format` (Note [Each rank reads its own part]).
    std::optional<std::vector<std::vector<uint8_t>>> table;
    compat::GlooAddressFormat format = compat::GlooAddressFormat::kOpaque;
  };

  // The address family ("<prefix>/") is sent to each reader apart; the host
  // names ("<prefix>/rank_") are read whole, as one table.
  static bool one_table_per_reader(const std::string& family) {
    return family.size() < 5 || family.compare(family.size() - 5, 5, "rank_") != 0;
  }
  std::string table_key(const std::string& family, int reader) const {
    return one_table_per_reader(family) ? family + "table/" + std::to_string(reader) : family + "table";
  }

  // "<digits>/<digits>" or "<digits>/rank_<digits>": (family, rank) when the
  // rank is one of this group's.
  std::optional<std::pair<std::string, int>> family_member(const std::string& key) const {
    const size_t slash = key.find('/');
    if (slash == 0 || slash == std::string::npos || !all_digits(key, 0, slash)) return std::nullopt;
    size_t digits = slash + 1;
    if (key.compare(digits, 5, "rank_") == 0) digits += 5;
    if (digits >= key.size() || key.size() - digits > 9 || !all_digits(key, digits, key.size())) return std::nullopt;
    const int rank = std::stoi(key.substr(digits));
    if (rank >= size_) return std::nullopt;
    return std::make_pair(key.substr(0, digits), rank);
  }

  static bool all_digits(const std::string& text, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
    }
    return true;
  }

  // Rank 0: every rank's value of `name`, read and published as one key.
  void publish_table(const std::string& name, Family& family) {
    std::vector<std::string> keys;
    for (int r = 1; r < size_; ++r) keys.push_back(name + std::to_string(r));
    std::vector<std::vector<uint8_t>> table{*family.own};
    if (!keys.empty()) {
      store_->wait(keys, timeout_);
      for (const auto& key : keys) table.push_back(store_->get(key));
    }
    if (one_table_per_reader(name)) {
      const compat::GlooAddressFormat format = compat::detect_gloo_address_format(table);
      for (int reader = 1; reader < size_; ++reader) {
        std::vector<std::vector<uint8_t>> parts(static_cast<size_t>(size_));
        for (int owner = 0; owner < size_; ++owner) {
          if (owner != reader) parts[owner] = compat::gloo_address_part(format, table[owner], owner, reader, size_);
        }
        store_->set(table_key(name, reader), encode(format, parts));
      }
    } else if (size_ > 1) {
      store_->set(table_key(name, 0), encode(compat::GlooAddressFormat::kOpaque, table));
    }
    family.table = std::move(table);  // whole values: kOpaque
  }

  // The family, its table fetched once (a rank other than 0); null when this
  // rank has not set its own key of the family yet.
  const Family* ready_family(const std::string& name, std::chrono::milliseconds timeout) {
    const auto found = families_.find(name);
    if (found == families_.end() || !found->second.own) return nullptr;
    Family& family = found->second;
    if (!family.table) {
      const std::string key = table_key(name, rank_);
      store_->wait({key}, timeout);
      std::tie(family.format, family.table) = decode(store_->get(key), key);
    }
    return &family;
  }

  // The format's tag, then each value as an 8-byte length and its bytes.
  static std::vector<uint8_t> encode(compat::GlooAddressFormat format, const std::vector<std::vector<uint8_t>>& values) {
    std::vector<uint8_t> bytes{static_cast<uint8_t>(format)};
    for (const auto& value : values) {
      const uint64_t length = value.size();
      const auto* raw = reinterpret_cast<const uint8_t*>(&length);
      bytes.insert(bytes.end(), raw, raw + sizeof(length));
      bytes.insert(bytes.end(), value.begin(), value.end());
    }
    return bytes;
  }

  std::pair<compat::GlooAddressFormat, std::vector<std::vector<uint8_t>>> decode(const std::vector<uint8_t>& bytes,
                                                                                 const std::string& key) const {
    LOCKSTEP_CHECK(!bytes.empty() && bytes[0] <= static_cast<uint8_t>(compat::GlooAddressFormat::kRankRecord),
                   "store key ", key, ": not a table of Gloo addresses (another job on the same store?)");
    const auto format = static_cast<compat::GlooAddressFormat>(bytes[0]);
    std::vector<std::vector<uint8_t>> values;
    size_t at = 1;
    while (at < bytes.size()) {
      uint64_t length = 0;
      LOCKSTEP_CHECK(bytes.size() - at >= sizeof(length), "store key ", key, ": a truncated table of Gloo addresses");
      std::memcpy(&length, bytes.data() + at, sizeof(length));
      at += sizeof(length);
      LOCKSTEP_CHECK(length <= bytes.size() - at, "store key ", key, ": a truncated table of Gloo addresses");
      values.emplace_back(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                          bytes.begin() + static_cast<std::ptrdiff_t>(at + length));
      at += length;
    }
    LOCKSTEP_CHECK(static_cast<int>(values.size()) == size_, "store key ", key, ": a table of ", values.size(),
                   " Gloo addresses for a group of ", size_, " ranks (another job on the same store?)");
    return {format, std::move(values)};
  }

  c10::intrusive_ptr<compat::C10dStore> store_;
  const int rank_;
  const int size_;
  std::mutex mutex_;
  std::map<std::string, Family> families_;
};

class CountingStore : public compat::StoreBase {
 public:
  CountingStore(c10::intrusive_ptr<compat::C10dStore> store, std::shared_ptr<std::atomic<int64_t>> operations,
                std::shared_ptr<std::atomic<int64_t>> bytes_read)
      : compat::StoreBase(store->getTimeout()),
        store_(std::move(store)),
        operations_(std::move(operations)),
        bytes_read_(std::move(bytes_read)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    ++*operations_;
    store_->set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                  const std::vector<uint8_t>& desired) override {
    ++*operations_;
    return store_->compareSet(key, current, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    ++*operations_;
    std::vector<uint8_t> value = store_->get(key);
    *bytes_read_ += static_cast<int64_t>(value.size());
    return value;
  }
  int64_t add(const std::string& key, int64_t value) override {
    ++*operations_;
    return store_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    ++*operations_;
    return store_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    ++*operations_;
    return store_->check(keys);
  }
  int64_t getNumKeys() override {
    ++*operations_;
    return store_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    ++*operations_;
    store_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    ++*operations_;
    store_->wait(keys, timeout);
  }
  void setTimeout(const std::chrono::milliseconds& timeout) override {
    compat::StoreBase::setTimeout(timeout);
    store_->setTimeout(timeout);
  }

 protected:
  c10::intrusive_ptr<compat::C10dStore> clone_store() override {
    return c10::make_intrusive<CountingStore>(compat::clone_store(store_), operations_, bytes_read_);
  }

 private:
  c10::intrusive_ptr<compat::C10dStore> store_;
  std::shared_ptr<std::atomic<int64_t>> operations_;
  std::shared_ptr<std::atomic<int64_t>> bytes_read_;
};

}  // namespace

c10::intrusive_ptr<compat::C10dStore> make_polling_store(c10::intrusive_ptr<compat::C10dStore> store,
                                                         std::chrono::milliseconds timeout, std::string where) {
  return c10::make_intrusive<PollingStore>(std::move(store), timeout, std::move(where));
}

BlockingStoreWaits::BlockingStoreWaits() : previous_(blocking_store_waits) { blocking_store_waits = true; }
BlockingStoreWaits::~BlockingStoreWaits() { blocking_store_waits = previous_; }
bool BlockingStoreWaits::active() { return blocking_store_waits; }

c10::intrusive_ptr<compat::C10dStore> make_address_table_store(c10::intrusive_ptr<compat::C10dStore> store, int rank,
                                                               int size, std::chrono::milliseconds timeout) {
  return c10::make_intrusive<AddressTableStore>(std::move(store), rank, size, timeout);
}

c10::intrusive_ptr<compat::C10dGroup> make_gloo_mesh(c10::intrusive_ptr<compat::C10dStore> exchange, int rank,
                                                     int size, std::chrono::milliseconds timeout,
                                                     const compat::GlooDeviceSpec& device) {
  // One socket per peer (Note [Raising the open-file limit] in core/open_files.cpp).
  const OpenFilesRoom room = make_room_for_open_files(size - 1, "", str_cat("a Gloo mesh of ", size, " ranks"));
  if (room.raised()) logger().info("group rank {} of {}: {}", rank, size, room.describe());
  return compat::make_gloo(make_address_table_store(std::move(exchange), rank, size, timeout), rank, size, timeout,
                           device);
}

CountedStore make_counting_store(c10::intrusive_ptr<compat::C10dStore> store) {
  CountedStore counted;
  counted.operations = std::make_shared<std::atomic<int64_t>>(0);
  counted.bytes_read = std::make_shared<std::atomic<int64_t>>(0);
  counted.store = c10::make_intrusive<CountingStore>(std::move(store), counted.operations, counted.bytes_read);
  return counted;
}

}  // namespace lockstep
