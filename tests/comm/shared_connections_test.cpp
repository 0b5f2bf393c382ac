// Views and side channels (Note [One mesh per process]): groups of the same
// ranks over one group's connections, on 2 and 4 ranks.
//   - A view's collectives interleave with its group's on one thread, and
//     rings of two views, in flight at once, each receive their own data
//     (their tags differ).
//   - A side channel gathers from a second thread while the main thread
//     all-reduces over the group, round after round, and every result is
//     the closed form: nothing pairs with the other thread's collectives.
//   - A side channel refuses what would take a place in the group's order,
//     naming the group; names are unique.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "tests/comm/dist_test_util.h"

namespace lockstep {
namespace {

using testing::tensors_equal;

// Rank r's piece of a gather, distinct per `round` and `stream`.
torch::Tensor piece(int rank, int round, int stream) {
  return torch::full({5}, static_cast<double>(1000 * stream + 10 * round + rank), torch::kDouble);
}

torch::Tensor all_pieces(int n, int round, int stream) {
  std::vector<torch::Tensor> pieces;
  for (int r = 0; r < n; ++r) pieces.push_back(piece(r, round, stream));
  return torch::cat(pieces);
}

LOCKSTEP_WORKER_TEST(SharedConnectionsWorker, AViewInterleavesWithItsGroup) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank();
  auto view = world->view("view");
  auto twin = world->view("twin");
  EXPECT_EQ(view->connections_of(), "world");
  EXPECT_EQ(view->size(), n);
  EXPECT_EQ(view->rank(), r);
  for (int round = 0; round < 5; ++round) {
    auto a = torch::full({3}, static_cast<double>(r + 1));
    auto b = torch::full({3}, static_cast<double>(2 * (r + 1)));
    auto on_world = world->all_reduce(a, ReduceOp::kSum, /*async=*/true);
    view->all_reduce(b, ReduceOp::kSum);
    on_world->wait();
    auto c = torch::full({3}, static_cast<double>(r + 1));
    twin->all_reduce(c, ReduceOp::kMax);
    EXPECT_TRUE(tensors_equal(c, torch::full({3}, static_cast<double>(n)))) << "round " << round;
    EXPECT_TRUE(tensors_equal(a, torch::full({3}, n * (n + 1) / 2.0))) << "round " << round;
    EXPECT_TRUE(tensors_equal(b, torch::full({3}, n * (n + 1.0)))) << "round " << round;
    // Two rings in flight at once, one per view, on their executors, with
    // the same sequence numbers (both views issue the same ops); odd ranks
    // start the second's first, so without tags of their own the rings'
    // messages would cross.
    auto world_out = torch::empty({5 * n}, torch::kDouble);
    auto view_out = torch::empty({5 * n}, torch::kDouble);
    std::shared_ptr<Work> world_ring, view_ring;
    auto start_world = [&] { world_ring = twin->all_gather_into_tensor(world_out, piece(r, round, 1), true); };
    auto start_view = [&] { view_ring = view->all_gather_into_tensor(view_out, piece(r, round, 2), true); };
    if (r % 2 == 0) {
      start_world();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      start_view();
    } else {
      start_view();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      start_world();
    }
    view_ring->wait();
    world_ring->wait();
    EXPECT_TRUE(tensors_equal(world_out, all_pieces(n, round, 1))) << "round " << round;
    EXPECT_TRUE(tensors_equal(view_out, all_pieces(n, round, 2))) << "round " << round;
  }
}

LOCKSTEP_WORKER_TEST(SharedConnectionsWorker, ASideChannelGathersFromAnotherThread) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int n = world->size(), r = world->rank();
  auto channel = world->side_channel("channel");
  constexpr int kRounds = 20;
  std::string thread_error;
  std::vector<std::vector<std::string>> gathered;
  std::thread gatherer([&] {
    try {
      for (int round = 0; round < kRounds; ++round) {
        // Objects of different lengths per rank: shapes, then bytes, both rings.
        gathered.push_back(all_gather_object(std::string(static_cast<size_t>(r + round), 'a' + r), channel));
      }
    } catch (const std::exception& e) {
      thread_error = e.what();
    }
  });
  for (int round = 0; round < kRounds; ++round) {
    auto t = torch::full({4}, static_cast<double>(r + 1));
    world->all_reduce(t, ReduceOp::kSum);
    EXPECT_TRUE(tensors_equal(t, torch::full({4}, n * (n + 1) / 2.0))) << "round " << round;
    world->barrier();
  }
  gatherer.join();
  ASSERT_EQ(thread_error, "");
  ASSERT_EQ(gathered.size(), static_cast<size_t>(kRounds));
  for (int round = 0; round < kRounds; ++round) {
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(gathered[round][q], std::string(static_cast<size_t>(q + round), 'a' + q)) << "round " << round;
    }
  }
}

LOCKSTEP_WORKER_TEST(SharedConnectionsWorker, ASideChannelRefusesWhatWouldJoinTheOrder) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  auto channel = world->side_channel("metrics");
  auto t = torch::ones({2});
  for (const auto& message : {testing::error_of([&] { channel->all_reduce(t); }),
                              testing::error_of([&] { channel->broadcast(t, 0); }),
                              testing::error_of([&] { channel->barrier(); })}) {
    EXPECT_NE(message.find("group 'metrics': this group is a side channel of group 'world'"), std::string::npos)
        << message;
  }
  // A view of a side channel is outside the order too.
  auto channel_view = channel->view("metrics.view");
  EXPECT_NE(testing::error_of([&] { channel_view->all_reduce(t); }).find("is a side channel of group 'world'"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { world->view("metrics"); }).find("already created"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { world->side_channel(""); }).find("name is empty"), std::string::npos);
  // Nothing was issued: the group goes on.
  auto one = torch::ones({1});
  world->all_reduce(one);
  EXPECT_EQ(one.item<float>(), static_cast<float>(world->size()));
}

TEST(SharedConnections, TwoRanks) { testing::expect_workers_pass(2, "SharedConnectionsWorker.*"); }

TEST(SharedConnections, FourRanks) { testing::expect_workers_pass(4, "SharedConnectionsWorker.*"); }

}  // namespace
}  // namespace lockstep
