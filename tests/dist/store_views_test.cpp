// The store views against Gloo's key exchange, played by one thread per rank
// over one in-process store: every rank reads every other rank's value, and
// through the address table a rank other than 0 does so in a constant number
// of store operations (Note [One table of Gloo addresses]). Real Gloo meshes
// go through the same view in every multi-process test; tests/scale counts
// its operations per rank in a DDP job of 8 and 64 ranks.
#include "lockstep/dist/internal/store_views.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

// What Gloo's connectFullMesh does with the store: the libtorch 1.13 one sets
// its host name and reads those of the ranks below it, then (both versions)
// sets its addresses and waits for and reads every other rank's. Returns what
// it read, in rank order, so that the test can check each value arrived.
std::vector<std::string> exchange_like_gloo(compat::C10dStore& store, int rank, int size, bool host_names) {
  std::vector<std::string> read;
  if (host_names) {
    store.set("0/rank_" + std::to_string(rank), bytes_of("host" + std::to_string(rank % 4)));
    for (int i = 0; i < rank; ++i) {
      const auto value = store.get("0/rank_" + std::to_string(i));
      read.emplace_back(value.begin(), value.end());
    }
  }
  store.set("0/" + std::to_string(rank), bytes_of("addresses of " + std::to_string(rank)));
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    store.wait({"0/" + std::to_string(i)}, std::chrono::seconds(20));
    const auto value = store.get("0/" + std::to_string(i));
    read.emplace_back(value.begin(), value.end());
  }
  return read;
}

struct ExchangeResult {
  std::vector<int64_t> operations;           // by rank
  std::vector<std::vector<std::string>> read;  // by rank
};

ExchangeResult run_exchange(int size, bool host_names, bool through_table) {
  auto shared = compat::make_hash_store();
  ExchangeResult result;
  result.operations.resize(size);
  result.read.resize(size);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      CountedStore counted = make_counting_store(shared);
      auto gloo_view = compat::make_prefix_store("group/world/gloo/", counted.store);
      if (through_table) gloo_view = make_address_table_store(gloo_view, rank, size, std::chrono::seconds(20));
      result.read[rank] = exchange_like_gloo(*gloo_view, rank, size, host_names);
      result.operations[rank] = counted.operations->load();
    });
  }
  for (auto& thread : ranks) thread.join();
  return result;
}

void expect_every_value_read(const ExchangeResult& result, int size, bool host_names) {
  for (int rank = 0; rank < size; ++rank) {
    std::vector<std::string> expected;
    if (host_names) {
      for (int i = 0; i < rank; ++i) expected.push_back("host" + std::to_string(i % 4));
    }
    for (int i = 0; i < size; ++i) {
      if (i != rank) expected.push_back("addresses of " + std::to_string(i));
    }
    EXPECT_EQ(result.read[rank], expected) << "rank " << rank;
  }
}

TEST(AddressTableStore, EveryRankReadsEveryValueInAConstantNumberOfOperations) {
  for (const bool host_names : {true, false}) {  // libtorch 1.13's Gloo, then 2.x's
    for (const int size : {1, 2, 8, 32}) {
      SCOPED_TRACE(::testing::Message() << size << " ranks, host names " << host_names);
      const ExchangeResult table = run_exchange(size, host_names, /*through_table=*/true);
      expect_every_value_read(table, size, host_names);
      const int families = host_names ? 2 : 1;
      // Rank 0 per family: one wait for the others' keys, a get of each, the table's set.
      EXPECT_EQ(table.operations[0], families * (size > 1 ? size + 1 : 1));
      for (int rank = 1; rank < size; ++rank) {
        // Per family: its own key's set, the table's wait and get.
        EXPECT_EQ(table.operations[rank], families * 3) << "rank " << rank;
      }
      // Without the view: a wait and a get of every other rank's key (and the
      // host names of the ranks below), growing with the group.
      const ExchangeResult plain = run_exchange(size, host_names, /*through_table=*/false);
      expect_every_value_read(plain, size, host_names);
      EXPECT_EQ(plain.operations[size - 1], families + 2 * (size - 1) + (host_names ? size - 1 : 0));
    }
  }
}

TEST(AddressTableStore, KeysOfAnotherShapePassThrough) {
  auto shared = compat::make_hash_store();
  auto view = make_address_table_store(shared, /*rank=*/1, /*size=*/2, std::chrono::seconds(5));
  view->set("SEQ_NUM_STORE_KEY", bytes_of("7"));
  EXPECT_EQ(shared->get("SEQ_NUM_STORE_KEY"), bytes_of("7"));
  view->set("0/0", bytes_of("rank 0's key, set for it"));  // not this rank's: straight through
  EXPECT_EQ(shared->get("0/0"), bytes_of("rank 0's key, set for it"));
  EXPECT_EQ(view->get("0/0"), bytes_of("rank 0's key, set for it"));  // before its own key: straight through
  view->set("0/7", bytes_of("x"));  // not a rank of this group
  EXPECT_EQ(shared->get("0/7"), bytes_of("x"));
  EXPECT_EQ(view->add("counter", 2), 2);
}

TEST(AddressTableStore, ATableForAnotherGroupSizeIsRefusedNamingItsKey) {
  auto shared = compat::make_hash_store();
  // Rank 0 of a group of 2 publishes; a rank that believes the group has 3 reads it.
  std::thread rank0([&] {
    auto view = make_address_table_store(shared, 0, 2, std::chrono::seconds(5));
    shared->set("0/1", bytes_of("b"));
    view->set("0/0", bytes_of("a"));
  });
  rank0.join();
  auto confused = make_address_table_store(shared, 1, 3, std::chrono::seconds(5));
  confused->set("0/1", bytes_of("b"));
  try {
    confused->get("0/2");
    FAIL() << "a table of 2 values cannot serve a group of 3";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("store key 0/table: a table of 2 Gloo addresses for a group of 3 ranks"),
              std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace lockstep
