// The store views against Gloo's key exchange, played by one thread per rank
// over one in-process store: every rank reads every other rank's value, and
// through the address table a rank other than 0 does so in a constant number
// of store operations (Note [One table of Gloo addresses]). Real Gloo meshes
// go through the same view in every multi-process test; tests/scale counts
// its operations per rank in a DDP job of 8 and 64 ranks.
#include "lockstep/comm/internal/store_views.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/compat/internal/gloo_addresses.h"
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

// What each rank spent on the shared store, by rank.
struct StoreUse {
  std::vector<int64_t> operations;
  std::vector<int64_t> bytes_read;
};

// One thread per rank over one in-process store, each running `as_rank` on
// its view of the group's Gloo keys (through the address table or not).
StoreUse run_ranks(int size, bool through_table,
                   const std::function<void(compat::C10dStore& view, int rank)>& as_rank) {
  auto shared = compat::make_hash_store();
  StoreUse use{std::vector<int64_t>(size), std::vector<int64_t>(size)};
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      CountedStore counted = make_counting_store(shared);
      auto view = compat::make_prefix_store("group/world/gloo/", counted.store);
      if (through_table) view = make_address_table_store(view, rank, size, std::chrono::seconds(20));
      as_rank(*view, rank);
      use.operations[rank] = counted.operations->load();
      use.bytes_read[rank] = counted.bytes_read->load();
    });
  }
  for (auto& thread : ranks) thread.join();
  return use;
}

struct ExchangeResult {
  std::vector<int64_t> operations;           // by rank
  std::vector<std::vector<std::string>> read;  // by rank
};

ExchangeResult run_exchange(int size, bool host_names, bool through_table) {
  ExchangeResult result;
  result.read.resize(size);
  result.operations = run_ranks(size, through_table, [&](compat::C10dStore& view, int rank) {
                        result.read[rank] = exchange_like_gloo(view, rank, size, host_names);
                      }).operations;
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
      // Rank 0: per family one wait for the others' keys and a get of each;
      // then the host names' table, and the addresses' table of each reader
      // (Note [Each rank reads its own part]).
      const int64_t names = host_names && size > 1 ? size + 1 : 0;
      const int64_t addresses = size > 1 ? 2 * size - 1 : 0;
      EXPECT_EQ(table.operations[0], names + addresses);
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
    EXPECT_NE(std::string(error.what()).find("store key 0/table/1: a table of 2 Gloo addresses for a group of 3 ranks"),
              std::string::npos) << error.what();
  }
}

// Gloo's values as each Gloo version builds them (gloo/rendezvous/context.cc
// before 2023-07, gloo/transport/tcp/context.cc's Rank since), and what Gloo on
// `reader` takes from `owner`'s value.
std::vector<uint8_t> socket_address(int owner, int peer) {
  std::vector<uint8_t> bytes(sizeof(sockaddr_storage) + sizeof(int64_t), 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(20000 + owner * 100 + peer));
  address.sin_addr.s_addr = htonl(0x7f000001u + static_cast<uint32_t>(owner));
  std::memcpy(bytes.data(), &address, sizeof(address));
  const int64_t sequence = owner * 1000 + peer;
  std::memcpy(bytes.data() + sizeof(sockaddr_storage), &sequence, sizeof(sequence));
  return bytes;
}

void append_u64(std::vector<uint8_t>& bytes, uint64_t value) {
  const auto* raw = reinterpret_cast<const uint8_t*>(&value);
  bytes.insert(bytes.end(), raw, raw + sizeof(value));
}

std::vector<uint8_t> gloo_value(compat::GlooAddressFormat format, int owner, int size) {
  std::vector<uint8_t> value;
  if (format == compat::GlooAddressFormat::kPairAddresses) {
    for (int peer = 0; peer < size; ++peer) {
      if (peer == owner) continue;
      const auto address = socket_address(owner, peer);
      value.insert(value.end(), address.begin(), address.end());
    }
    return value;
  }
  const std::string host = "host" + std::to_string(owner % 4);
  append_u64(value, host.size());
  value.insert(value.end(), host.begin(), host.end());
  const auto device = socket_address(owner, owner);
  append_u64(value, device.size());
  value.insert(value.end(), device.begin(), device.end());
  for (int peer = 0; peer < size; ++peer) append_u64(value, static_cast<uint64_t>(owner * 1000 + peer));
  return value;
}

// What Gloo reads: extractAddress's slice, or Rank's host name, address and pair number `reader`.
std::vector<uint8_t> what_gloo_reads(compat::GlooAddressFormat format, const std::vector<uint8_t>& value, int owner,
                                     int reader, int size) {
  if (format == compat::GlooAddressFormat::kPairAddresses) {
    const size_t each = value.size() / static_cast<size_t>(size - 1);
    const size_t index = static_cast<size_t>(reader > owner ? reader - 1 : reader);
    return std::vector<uint8_t>(value.begin() + index * each, value.begin() + (index + 1) * each);
  }
  const size_t numbers_at = value.size() - sizeof(int64_t) * static_cast<size_t>(size);
  std::vector<uint8_t> read(value.begin(), value.begin() + numbers_at);
  const auto number = value.begin() + numbers_at + sizeof(int64_t) * static_cast<size_t>(reader);
  read.insert(read.end(), number, number + sizeof(int64_t));
  return read;
}

// Every rank reads, through the table, exactly what Gloo reads of every
// other rank's value, and O(N) bytes in all, where the values hold O(N)
// bytes each (Note [Each rank reads its own part]).
TEST(AddressTableStore, EachRankReadsOnlyItsPartOfGlooValues) {
  for (const auto format : {compat::GlooAddressFormat::kPairAddresses, compat::GlooAddressFormat::kRankRecord}) {
    for (const int size : {2, 8, 32}) {
      SCOPED_TRACE(::testing::Message() << size << " ranks, format " << static_cast<int>(format));
      std::vector<std::vector<uint8_t>> values;
      for (int owner = 0; owner < size; ++owner) values.push_back(gloo_value(format, owner, size));
      ASSERT_EQ(compat::detect_gloo_address_format(values), format);
      for (const bool through_table : {true, false}) {
        std::vector<int> wrong(size, 0);
        const StoreUse use = run_ranks(size, through_table, [&](compat::C10dStore& view, int rank) {
          view.set("0/" + std::to_string(rank), values[rank]);
          for (int owner = 0; owner < size; ++owner) {
            if (owner == rank) continue;
            view.wait({"0/" + std::to_string(owner)}, std::chrono::seconds(20));
            const auto got = view.get("0/" + std::to_string(owner));
            if (what_gloo_reads(format, got, owner, rank, size) !=
                what_gloo_reads(format, values[owner], owner, rank, size)) {
              ++wrong[rank];
            }
          }
        });
        const std::vector<int64_t>& operations = use.operations;
        const std::vector<int64_t>& bytes = use.bytes_read;
        for (int rank = 0; rank < size; ++rank) EXPECT_EQ(wrong[rank], 0) << "rank " << rank;
        for (int rank = 1; rank < size; ++rank) {
          if (through_table) {
            EXPECT_EQ(operations[rank], 3) << "rank " << rank;
            // Its part of each value (144 or 168 bytes here) and the table's framing.
            EXPECT_LE(bytes[rank], 200 * size) << "rank " << rank;
          } else {
            EXPECT_EQ(bytes[rank], static_cast<int64_t>(values[0].size()) * (size - 1)) << "every value whole";
          }
        }
      }
    }
  }
}

TEST(GlooAddressFormat, ValuesOfNeitherFormatAreReadWhole) {
  const std::vector<std::vector<uint8_t>> names{bytes_of("host0"), bytes_of("host1")};
  EXPECT_EQ(compat::detect_gloo_address_format(names), compat::GlooAddressFormat::kOpaque);
  // One rank of another format (or a truncated value) makes the family opaque.
  std::vector<std::vector<uint8_t>> mixed{gloo_value(compat::GlooAddressFormat::kPairAddresses, 0, 2),
                                          gloo_value(compat::GlooAddressFormat::kRankRecord, 1, 2)};
  EXPECT_EQ(compat::detect_gloo_address_format(mixed), compat::GlooAddressFormat::kOpaque);
  auto truncated = gloo_value(compat::GlooAddressFormat::kRankRecord, 1, 2);
  truncated.pop_back();
  EXPECT_EQ(compat::detect_gloo_address_format({gloo_value(compat::GlooAddressFormat::kRankRecord, 0, 2), truncated}),
            compat::GlooAddressFormat::kOpaque);
  EXPECT_EQ(compat::gloo_address_part(compat::GlooAddressFormat::kOpaque, names[1], 1, 0, 2), names[1]);
}

}  // namespace
}  // namespace lockstep
