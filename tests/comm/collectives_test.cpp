// Every collective of lockstep::ProcessGroup on 2 and 4 ranks, for float32,
// float64, int64, bfloat16, float16 and int16, against closed forms of rank-dependent inputs:
// rank r contributes (r+1)*(i+1) at position i, so over N ranks the sum is
// (i+1)*N(N+1)/2, the max (i+1)*N and the min (i+1).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>
#include <thread>

#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "tests/comm/dist_test_util.h"

namespace lockstep {
namespace {

using testing::tensors_equal;
using testing::tested_dtypes;

double closed_form(ReduceOp op, double base, int n) {
  switch (op) {
    case ReduceOp::kSum: return base * n * (n + 1) / 2.0;
    case ReduceOp::kAvg: return base * (n + 1) / 2.0;
    case ReduceOp::kMax: return base * n;
    case ReduceOp::kMin: return base;
  }
  return 0;
}

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

std::vector<CollectiveAlgorithm> reduce_scatter_algorithms(const ProcessGroup& group, const torch::Tensor& t) {
  std::vector<CollectiveAlgorithm> algorithms{CollectiveAlgorithm::kAuto, CollectiveAlgorithm::kRing,
                                              CollectiveAlgorithm::kAllReduce};
  if (has_native_collective(group, t, true)) algorithms.push_back(CollectiveAlgorithm::kNative);
  return algorithms;
}

LOCKSTEP_WORKER_TEST(CollectivesWorker, AllReduce) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank();
  for (auto dtype : tested_dtypes()) {
    for (ReduceOp op : kOps) {
      SCOPED_TRACE(::testing::Message() << dtype << " " << to_string(op));
      auto index = torch::arange(1, 6, torch::kDouble);
      auto t = (index * (r + 1)).to(dtype);
      if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) {
        EXPECT_NE(testing::error_of([&] { world->all_reduce(t, op); }).find("needs a floating-point tensor"),
                  std::string::npos);
        continue;
      }
      world->all_reduce(t, op);
      EXPECT_EQ(t.scalar_type(), dtype);
      EXPECT_TRUE(tensors_equal(t, index * closed_form(op, 1.0, n)));
    }
  }
  // Large enough for Gloo to split it, and not contiguous.
  auto base = (torch::arange(0, 200000, torch::kLong) % 7 + 1).to(torch::kFloat);
  auto big = (base * (r + 1)).reshape({400, 500}).t();
  ASSERT_FALSE(big.is_contiguous());
  world->all_reduce(big, ReduceOp::kSum);
  EXPECT_TRUE(tensors_equal(big, (base * (n * (n + 1) / 2)).reshape({400, 500}).t()));
}

LOCKSTEP_WORKER_TEST(CollectivesWorker, Broadcast) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank(), root = n - 1;
  auto reference = torch::arange(0, 7, torch::kDouble) * 3 + 1;
  for (auto dtype : tested_dtypes()) {
    SCOPED_TRACE(::testing::Message() << dtype);
    auto t = r == root ? reference.to(dtype) : torch::zeros({7}, dtype);
    world->broadcast(t, root);
    EXPECT_TRUE(tensors_equal(t, reference));
  }
  auto flags = r == root ? torch::tensor({true, false, true}) : torch::zeros({3}, torch::kBool);
  world->broadcast(flags, root);
  EXPECT_TRUE(tensors_equal(flags, torch::tensor({1.0, 0.0, 1.0})));
}

LOCKSTEP_WORKER_TEST(CollectivesWorker, AllGatherIntoTensor) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank();
  std::vector<CollectiveAlgorithm> algorithms{CollectiveAlgorithm::kAuto, CollectiveAlgorithm::kRing};
  if (has_native_collective(*world, torch::zeros({1}), false)) algorithms.push_back(CollectiveAlgorithm::kNative);
  // Rank q's slice holds q*10 + i.
  auto expected = (torch::arange(0, n, torch::kDouble).unsqueeze(1) * 10 + torch::arange(0, 3, torch::kDouble));
  for (auto algorithm : algorithms) {
    world->set_algorithms({CollectiveAlgorithm::kAuto, algorithm});
    for (auto dtype : tested_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype << " algorithm " << static_cast<int>(algorithm));
      auto in = (torch::arange(0, 3, torch::kDouble) + r * 10).to(dtype);
      auto out = torch::full({n, 3}, -1, dtype);
      world->all_gather_into_tensor(out, in);
      EXPECT_TRUE(tensors_equal(out, expected));
    }
  }
  world->set_algorithms({CollectiveAlgorithm::kAuto, CollectiveAlgorithm::kAuto});
  // The input may be this rank's slice of the output (FSDP gathers in place).
  auto out = torch::zeros({n * 4});
  auto mine = out.narrow(0, r * 4, 4);
  mine.fill_(r + 1);
  world->all_gather_into_tensor(out, mine);
  EXPECT_TRUE(tensors_equal(out, torch::arange(1, n + 1, torch::kDouble).repeat_interleave(4)));
  EXPECT_NE(testing::error_of([&] {
              auto wrong = torch::zeros({n * 3 + 1});
              world->all_gather_into_tensor(wrong, torch::zeros({3}));
            }).find("expected " + std::to_string(n) + " x 3"),
            std::string::npos);
}

LOCKSTEP_WORKER_TEST(CollectivesWorker, ReduceScatterTensor) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank(), k = 3;
  auto position = torch::arange(1, n * k + 1, torch::kDouble);  // j + 1
  auto my_positions = torch::arange(r * k + 1, r * k + k + 1, torch::kDouble);
  for (auto algorithm : reduce_scatter_algorithms(*world, torch::zeros({1}))) {
    world->set_algorithms({algorithm, CollectiveAlgorithm::kAuto});
    for (auto dtype : tested_dtypes()) {
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
        if (algorithm == CollectiveAlgorithm::kNative &&
            !has_native_collective(*world, torch::zeros({1}, dtype), true, op)) {
          continue;
        }
        SCOPED_TRACE(::testing::Message() << dtype << " " << to_string(op) << " algorithm " << static_cast<int>(algorithm));
        auto in = (position * (r + 1)).to(dtype);
        auto out = torch::full({k}, -1, dtype);
        world->reduce_scatter_tensor(out, in, op);
        EXPECT_TRUE(tensors_equal(out, my_positions * closed_form(op, 1.0, n)));
      }
    }
  }
  world->set_algorithms({CollectiveAlgorithm::kAuto, CollectiveAlgorithm::kAuto});
  EXPECT_NE(testing::error_of([&] {
              auto out = torch::zeros({2});
              world->reduce_scatter_tensor(out, torch::zeros({2 * n + 1}));
            }).find("expected " + std::to_string(n) + " x 2"),
            std::string::npos);
}

LOCKSTEP_WORKER_TEST(CollectivesWorker, AllGatherUnevenSizes) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank();
  // Rank q sends a (q+1) x 2 tensor of q*10 + i (exact in bfloat16).
  auto contribution = [](int q) { return (torch::arange(0, 2 * (q + 1), torch::kDouble) + q * 10).reshape({q + 1, 2}); };
  // kAuto: doubling rounds from 4 ranks on (Note [Doubling rounds for small gathers]); kRing: the ring.
  for (auto algorithm : {CollectiveAlgorithm::kAuto, CollectiveAlgorithm::kRing}) {
    world->set_algorithms({CollectiveAlgorithm::kAuto, algorithm});
    for (auto dtype : tested_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype << " algorithm " << static_cast<int>(algorithm));
      std::vector<torch::Tensor> outs;
      world->all_gather(outs, contribution(r).to(dtype));
      ASSERT_EQ(outs.size(), static_cast<size_t>(n));
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(outs[q].sizes(), torch::IntArrayRef({q + 1, 2}));
        EXPECT_EQ(outs[q].scalar_type(), dtype);
        EXPECT_TRUE(tensors_equal(outs[q], contribution(q)));
      }
      // Pre-sized outputs are filled in place, without the shape exchange.
      std::vector<torch::Tensor> presized;
      for (int q = 0; q < n; ++q) presized.push_back(torch::zeros({q + 1, 2}, dtype));
      auto first = presized[0];
      world->all_gather(presized, contribution(r).to(dtype));
      EXPECT_TRUE(tensors_equal(first, contribution(0)));
    }
  }
  world->set_algorithms({CollectiveAlgorithm::kAuto, CollectiveAlgorithm::kAuto});
  // An empty contribution is fine too.
  std::vector<torch::Tensor> outs;
  world->all_gather(outs, torch::ones({r % 2 == 0 ? 0 : 2}));
  for (int q = 0; q < n; ++q) EXPECT_EQ(outs[q].numel(), q % 2 == 0 ? 0 : 2);
  // Above kDoublingMaxBytes in all, kAuto takes the ring: 300,000 floats a rank.
  std::vector<torch::Tensor> large;
  world->all_gather(large, torch::arange(0, 300000, torch::kFloat) + r);
  for (int q = 0; q < n; ++q) EXPECT_TRUE(tensors_equal(large[q], torch::arange(0, 300000, torch::kFloat) + q));
}

LOCKSTEP_WORKER_TEST(CollectivesWorker, AsyncAndWait) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank();
  auto a = torch::full({1000}, r + 1.0);
  auto in = torch::arange(1, 2 * n + 1, torch::kDouble).to(torch::kFloat) * (r + 1);
  auto scattered = torch::zeros({2});
  auto gathered = torch::zeros({n});
  auto mine = torch::full({1}, static_cast<double>(r));
  world->set_algorithms({CollectiveAlgorithm::kRing, CollectiveAlgorithm::kAuto});  // the executor path
  auto w1 = world->all_reduce(a, ReduceOp::kAvg, /*async=*/true);
  auto w2 = world->reduce_scatter_tensor(scattered, in, ReduceOp::kSum, /*async=*/true);
  auto w3 = world->all_gather_into_tensor(gathered, mine, /*async=*/true);
  auto w4 = world->barrier(/*async=*/true);
  w4->wait();
  w3->wait(std::chrono::seconds(30));
  w2->wait();
  w1->wait();
  EXPECT_TRUE(w1->is_completed() && w2->is_completed() && w3->is_completed() && w4->is_completed());
  w1->wait();  // a second wait is a no-op
  EXPECT_TRUE(tensors_equal(a, torch::full({1000}, (n + 1) / 2.0)));
  EXPECT_TRUE(tensors_equal(scattered, torch::arange(2 * r + 1, 2 * r + 3, torch::kDouble) * (n * (n + 1) / 2)));
  EXPECT_TRUE(tensors_equal(gathered, torch::arange(0, n, torch::kDouble)));
  EXPECT_NE(w2->description().find("reduce_scatter_tensor #"), std::string::npos);
}

LOCKSTEP_WORKER_TEST(CollectivesWorker, SendRecv) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (auto dtype : tested_dtypes()) {
    SCOPED_TRACE(::testing::Message() << dtype);
    auto outgoing = (torch::arange(0, 5, torch::kDouble) + r * 10).to(dtype);
    auto incoming = torch::zeros({5}, dtype);
    auto sent = world->send(outgoing, next, /*tag=*/7, /*async=*/true);
    world->recv(incoming, prev, /*tag=*/7);
    sent->wait();
    EXPECT_TRUE(tensors_equal(incoming, torch::arange(0, 5, torch::kDouble) + prev * 10));
  }
  // Two tags in flight at once, received in the opposite order; a strided target.
  auto first = torch::full({3}, r + 0.5), second = torch::full({3}, r + 0.25);
  auto s1 = world->send(first, next, 1, true);
  auto s2 = world->send(second, next, 2, true);
  auto got2 = torch::zeros({3, 2}).select(1, 1);
  auto got1 = torch::zeros({3});
  world->recv(got2, prev, 2);
  world->recv(got1, prev, 1);
  s1->wait();
  s2->wait();
  EXPECT_TRUE(tensors_equal(got1, torch::full({3}, prev + 0.5)));
  EXPECT_TRUE(tensors_equal(got2, torch::full({3}, prev + 0.25)));
  EXPECT_NE(testing::error_of([&] { world->send(first, r); }).find("cannot send to itself"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { world->send(first, next, 1 << 30); }).find("outside [0, 2^30)"),
            std::string::npos);
}

LOCKSTEP_WORKER_TEST(CollectivesWorker, Subgroups) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank();
  std::vector<int> evens, odds;
  for (int q = 0; q < n; ++q) (q % 2 == 0 ? evens : odds).push_back(q);
  auto even_group = world->new_group(evens);
  auto odd_group = world->new_group(odds, "odds");
  auto& mine = r % 2 == 0 ? even_group : odd_group;
  ASSERT_TRUE(mine != nullptr);
  EXPECT_EQ(r % 2 == 0 ? odd_group : even_group, nullptr);
  const auto& members = r % 2 == 0 ? evens : odds;
  EXPECT_EQ(mine->size(), static_cast<int>(members.size()));
  EXPECT_EQ(mine->rank(), r / 2);
  EXPECT_EQ(mine->global_ranks(), members);
  auto t = torch::full({4}, static_cast<double>(r));
  mine->all_reduce(t, ReduceOp::kSum);
  double expected = 0;
  for (int q : members) expected += q;
  EXPECT_TRUE(tensors_equal(t, torch::full({4}, expected)));
  // Collectives built from send/recv work inside a subgroup too.
  auto gathered = torch::zeros({mine->size()});
  mine->all_gather_into_tensor(gathered, torch::full({1}, static_cast<double>(r)));
  std::vector<double> member_values(members.begin(), members.end());
  EXPECT_TRUE(tensors_equal(gathered, torch::tensor(member_values, torch::kDouble)));
  if (r % 2 == 1) {
    EXPECT_NE(testing::error_of([&] { world->new_group(odds, "odds"); }).find("already created"),
              std::string::npos);
  }
  // A subgroup of a subgroup, and the world again through the subgroups' store.
  auto single = mine->new_group({mine->rank()});
  ASSERT_TRUE(single != nullptr);
  EXPECT_EQ(single->size(), 1);
  EXPECT_EQ(single->global_rank(0), r);
  world->barrier();
}

// Two threads of each rank build groups at the same time, in opposite orders
// on even and odd ranks, as the trainer's metrics writer and main thread do:
// a thread waiting for a peer's key must not keep its own process from
// setting one (Note [Waiting without holding the store]). Each round either
// builds both groups and reduces over them, or times out.
LOCKSTEP_WORKER_TEST(GroupThreadsWorker, TwoThreadsBuildGroupsAtOnce) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank();
  std::vector<int> everyone(static_cast<size_t>(n));
  std::iota(everyone.begin(), everyone.end(), 0);
  for (int round = 0; round < 4; ++round) {
    std::string mine = str_cat("a", round), other = str_cat("b", round);
    if (r % 2 == 1) std::swap(mine, other);
    auto build_and_reduce = [&](const std::string& name) {
      auto group = world->new_group(everyone, name);
      auto t = torch::full({3}, static_cast<double>(r + 1));
      group->all_reduce(t, ReduceOp::kSum);
      return t;
    };
    std::string thread_error;
    torch::Tensor from_thread;
    std::thread thread([&] {
      try {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        from_thread = build_and_reduce(other);
      } catch (const std::exception& e) {
        thread_error = e.what();
      }
    });
    std::string main_error;
    torch::Tensor from_main;
    try {
      from_main = build_and_reduce(mine);
    } catch (const std::exception& e) {
      main_error = e.what();
    }
    thread.join();
    ASSERT_EQ(main_error, "") << "round " << round;
    ASSERT_EQ(thread_error, "") << "round " << round;
    const auto expected = torch::full({3}, n * (n + 1) / 2.0);
    EXPECT_TRUE(tensors_equal(from_main, expected));
    EXPECT_TRUE(tensors_equal(from_thread, expected));
  }
}

TEST(Collectives, GroupsBuiltFromTwoThreadsOnEachRank) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto result = testing::run_workers(2, "GroupThreadsWorker.*", testing::worker_options({"LOCKSTEP_TIMEOUT_S=10"}));
  EXPECT_WORKERS_OK(result);
}

LOCKSTEP_WORKER_TEST(CollectivesWorker, ObjectCollectives) {
  testing::WorkerWorld session;
  const int n = get_world_size(), r = get_rank();
  EXPECT_EQ(r, std::stoi(std::getenv("RANK")));
  EXPECT_EQ(n, std::stoi(std::getenv("WORLD_SIZE")));
  EXPECT_EQ(get_local_rank(), std::stoi(std::getenv("LOCAL_RANK")));
  EXPECT_EQ(get_local_size(), n);  // one machine
  EXPECT_EQ(is_main_process(), r == 0);
  synchronize();

  auto word = [](int q) { return std::string(static_cast<size_t>(q), static_cast<char>('a' + q)); };  // rank 0: ""
  auto words = all_gather_object(word(r));
  ASSERT_EQ(words.size(), static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) EXPECT_EQ(words[q], word(q));

  auto objects = all_gather_object(nlohmann::json{{"rank", r}, {"name", "w" + std::to_string(r)}});
  for (int q = 0; q < n; ++q) EXPECT_EQ(objects[q]["name"], "w" + std::to_string(q));

  auto gathered = gather_object(word(r), /*dst=*/n - 1);
  EXPECT_EQ(gathered.size(), r == n - 1 ? static_cast<size_t>(n) : 0u);
  if (r == n - 1) EXPECT_EQ(gathered[1], word(1));

  const int src = 1 % n;
  EXPECT_EQ(broadcast_object(std::string(r == src ? "from the source" : "ignored"), src), "from the source");
  auto config = broadcast_object(nlohmann::json{{"lr", r == src ? 0.5 : 9.0}}, src);
  EXPECT_EQ(config["lr"], 0.5);

  auto averaged = reduce_dict({{"a", double(r)}, {"b", 2.0 * r}}, /*average=*/true);
  EXPECT_DOUBLE_EQ(averaged["a"], (n - 1) / 2.0);
  EXPECT_DOUBLE_EQ(averaged["b"], static_cast<double>(n - 1));
  auto summed = reduce_dict({{"a", 1.0}}, /*average=*/false);
  EXPECT_DOUBLE_EQ(summed["a"], n);
  std::map<std::string, double> uneven{{"loss", 1.0}};
  if (r == 0) uneven["extra"] = 2.0;
  auto message = testing::error_of([&] { reduce_dict(uneven); });
  EXPECT_NE(message.find("ranks hold different keys"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0: [\"extra\",\"loss\"]"), std::string::npos) << message;

  auto seed = shared_random_seed();
  auto seeds = all_gather_object(std::to_string(seed));
  for (const auto& s : seeds) EXPECT_EQ(s, std::to_string(seed));
}

TEST(Collectives, TwoRanks) {
  testing::expect_workers_pass(2, "CollectivesWorker.*");
}

TEST(Collectives, FourRanks) {
  testing::expect_workers_pass(4, "CollectivesWorker.*");
}

// Every collective again where Gloo is taken to know no 16-bit type, as
// Debian's libtorch 2.14 (Note [Gloo's 16-bit types, asked]): float16,
// bfloat16 and int16 move as bytes and reduce in float32 or int32, with the
// same results. Without this the path would run only in CI's 2.14 leg.
TEST(Collectives, FourRanksWithoutGlooSixteenBitTypes) {
  testing::expect_workers_pass(4, "CollectivesWorker.*", {"LOCKSTEP_GLOO_16_BIT_TYPES=0"});
}

// Five ranks: the doubling all-gather's last round carries fewer pieces than
// its distance (min(4, 5 - 4) = 1), which powers of two never exercise.
TEST(Collectives, FiveRanksGather) {
  testing::expect_workers_pass(5, "CollectivesWorker.AllGather*:CollectivesWorker.ObjectCollectives");
}

}  // namespace
}  // namespace lockstep
