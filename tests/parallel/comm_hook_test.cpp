// Slow links: the hierarchical all_reduce against the flat one, DDP with it
// against one process, and comm hooks written to the contract before run().
//
// The hierarchical all_reduce runs on a simulated node split here (ranks
// {0, 1} and {2, 3} on loopback); tests/multinode runs it across two network
// namespace hosts, where the split comes from the launcher.
#include <gtest/gtest.h>

#include <cstdlib>

#include "lockstep/comm/comm.h"
#include "lockstep/comm/env.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/ddp/comm_hook.h"
#include "lockstep/parallel/ddp/distributed_data_parallel.h"
#include "tests/parallel/ddp_models.h"
#include "tests/support/multiprocess.h"
#include "tests/support/logits_classifier.h"

namespace lockstep {
namespace {

// The node of each rank: HIER_RANKS_PER_NODE=N splits the ranks into runs of
// N; without it, the launcher's GROUP_RANK (the multinode test).
std::vector<int> node_split(int world_size) {
  std::vector<int> nodes(static_cast<size_t>(world_size));
  const char* per_node = std::getenv("HIER_RANKS_PER_NODE");
  if (per_node != nullptr && *per_node != '\0') {
    for (int r = 0; r < world_size; ++r) nodes[static_cast<size_t>(r)] = r / std::atoi(per_node);
    return nodes;
  }
  auto all = all_gather_object(nlohmann::json(detect_dist_env().node_rank));
  for (int r = 0; r < world_size; ++r) nodes[static_cast<size_t>(r)] = all[static_cast<size_t>(r)].get<int>();
  return nodes;
}

// Every rank holds the same bits.
void expect_same_on_every_rank(const torch::Tensor& tensor, const std::string& what) {
  std::vector<torch::Tensor> all;
  world()->all_gather(all, tensor.contiguous());
  for (size_t r = 1; r < all.size(); ++r) {
    EXPECT_TRUE(torch::equal(all[0], all[r])) << what << ": rank " << r << " holds other bits than rank 0";
  }
}

LOCKSTEP_WORKER_TEST(CommHookWorker, HierarchicalAllReduceMatchesFlat) {
  testing::WorkerWorld world_guard;
  const int size = get_world_size();
  std::vector<int> members(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) members[static_cast<size_t>(r)] = r;
  auto flat = world()->new_group(members, "flat");
  auto hierarchical = world()->new_group(members, "hierarchical");
  auto hierarchy = hierarchical->enable_hierarchical_all_reduce(node_split(size));
  ASSERT_TRUE(hierarchy);
  EXPECT_TRUE(hierarchical->hierarchical_all_reduce());
  std::cout << "hierarchy: " << *hierarchy << std::endl;
  torch::manual_seed(100 + get_rank());
  // An odd length, so no chunking lines up by accident.
  const torch::Tensor values = torch::randn({100003}) * 10;
  for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf, torch::kLong}) {
      if (op == ReduceOp::kAvg && dtype == torch::kLong) continue;
      SCOPED_TRACE(std::string(to_string(op)) + " " + c10::toString(dtype));
      torch::Tensor a = dtype == torch::kLong ? (values * 100).to(dtype) : values.to(dtype);
      torch::Tensor b = a.clone();
      flat->all_reduce(a, op);
      hierarchical->all_reduce(b, op);
      expect_same_on_every_rank(b, "hierarchical");
      if (dtype == torch::kLong || op == ReduceOp::kMax || op == ReduceOp::kMin) {
        EXPECT_TRUE(torch::equal(a, b));  // no rounding: exact
      } else {
        // Another order of the same sum: equal to rounding.
        const double tolerance = dtype == torch::kDouble ? 1e-12 : dtype == torch::kFloat ? 1e-5 : 2e-2;
        EXPECT_TRUE(torch::allclose(a.to(torch::kDouble), b.to(torch::kDouble), tolerance, tolerance * 10))
            << "largest difference " << (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
      }
    }
  }
  // Several in flight at once keep one order on every rank, small ones and
  // ones of several 4 MiB pieces (an odd length: the last piece is short).
  std::vector<torch::Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 6; ++i) {
    const int64_t length = i % 2 == 0 ? 1000 * (i + 1) : 2500007 + i;
    tensors.push_back(torch::full({length}, static_cast<float>(get_rank() + i)));
    works.push_back(hierarchical->all_reduce(tensors.back(), ReduceOp::kSum, /*async=*/true));
  }
  for (int i = 0; i < 6; ++i) {
    works[static_cast<size_t>(i)]->wait();
    const float expected = static_cast<float>(size * (size - 1) / 2 + size * i);
    EXPECT_TRUE(tensors[static_cast<size_t>(i)].eq(expected).all().item<bool>()) << "tensor " << i;
  }
}

TEST(CommHook, HierarchicalAllReduceMatchesFlat) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  // Two nodes of two; and an uneven split, a node of two and a node of one.
  for (auto [nproc, per_node] : {std::pair{4, "2"}, std::pair{3, "2"}}) {
    auto result = testing::run_workers(nproc, "CommHookWorker.HierarchicalAllReduceMatchesFlat",
                                       {std::string("HIER_RANKS_PER_NODE=") + per_node});
    EXPECT_WORKERS_OK(result) << nproc << " ranks, " << per_node << " per node";
    EXPECT_NE(result.output.find(nproc == 4 ? "hierarchy: 2 nodes of 2, 2 ranks" : "hierarchy: 2 nodes of 2, 1 ranks"),
              std::string::npos)
        << result.output;
  }
}

// A hook written to the contract before run(): it overrides launch() and
// expects the bucket divided already. It still trains like one process.
class LegacySumHook : public CommHook {
 public:
  std::unique_ptr<PendingReduction> launch(ProcessGroup& group, torch::Tensor bucket, size_t /*index*/) override {
    ++launches;
    return std::make_unique<PendingReduction>(group.all_reduce(bucket, ReduceOp::kSum, /*async=*/true));
  }
  std::string name() const override { return "legacy_sum"; }
  int launches = 0;
};

// DDP with `hook` (or none) and `options` against one process holding the
// whole batch, as tests/parallel/ddp_test.cpp's equivalence runs.
void train_against_one_process(std::shared_ptr<CommHook> hook, DDPOptions options) {
  torch::manual_seed(7);
  auto model = std::make_shared<testing::DdpMlp>();
  torch::manual_seed(7);
  auto reference = std::make_shared<testing::DdpMlp>();
  auto ddp = std::make_shared<DistributedDataParallel>(model, world(), options);
  if (hook) ddp->register_comm_hook(hook);
  auto optim = testing::sgd_momentum(*model);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, 8);
  auto reference_optim = testing::sgd_momentum(*reference);
  reference_optim->initialize_count_status(0, 8);
  const int64_t per_rank = 6;
  for (int step = 0; step < 8; ++step) {
    Batch global = testing::global_batch(per_rank * get_world_size(), static_cast<uint64_t>(step));
    model->train_step(global.slice(get_rank() * per_rank, per_rank), *optim);
    reference->train_step(global, *reference_optim);
  }
  testing::expect_same_state(*model, *reference, 1e-5, 1e-6);
}

LOCKSTEP_WORKER_TEST(CommHookWorker, LegacyHookStillTrainsLikeOneProcess) {
  testing::WorkerWorld world_guard;
  auto hook = std::make_shared<LegacySumHook>();
  train_against_one_process(hook, DDPOptions());
  EXPECT_GT(hook->launches, 0);
}

LOCKSTEP_WORKER_TEST(CommHookWorker, HierarchicalDdpMatchesOneProcess) {
  testing::WorkerWorld world_guard;
  const char* hook = std::getenv("HIER_HOOK");
  train_against_one_process(hook != nullptr && *hook ? make_comm_hook(Config::scalar(hook)) : nullptr,
                            DDPOptions().ranks_per_node(2).hierarchical_all_reduce("on").bucket_cap_mb(0.01));
}

// Four layers: with tiny bucket caps, eight buckets.
struct DeepMlp : testing::LogitsClassifier {
  DeepMlp() {
    for (int i = 0; i < 4; ++i) {
      layers.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(i == 0 ? 16 : 48, i == 3 ? 5 : 48)));
    }
  }
  torch::Tensor logits(const torch::Tensor& input) override {
    torch::Tensor x = input;
    for (size_t i = 0; i < layers.size(); ++i) x = i + 1 < layers.size() ? torch::relu(layers[i](x)) : layers[i](x);
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};

// PowerSGD starts its second all_reduce while earlier buckets are still in
// the hierarchical pipeline; many small buckets make the orders collide if
// anything issues out of turn (a mis-paired collective still hands every rank
// the same sum, so the weights are held to a flat run's).
std::vector<torch::Tensor> train_with_powersgd(const std::string& hierarchical) {
  torch::manual_seed(7);
  auto model = std::make_shared<DeepMlp>();
  auto ddp = std::make_shared<DistributedDataParallel>(model, world(),
                                                       DDPOptions()
                                                           .ranks_per_node(2)
                                                           .hierarchical_all_reduce(hierarchical)
                                                           .first_bucket_cap_mb(0.0001)
                                                           .bucket_cap_mb(0.0005));
  EXPECT_EQ(ddp->hierarchical(), hierarchical == "on");
  ddp->register_comm_hook(
      make_comm_hook(parse_config("{type: PowerSGD, matrix_approximation_rank: 2, start_powerSGD_iter: 2}")));
  auto optim = testing::sgd_momentum(*model);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, 12);
  for (int step = 0; step < 12; ++step) {
    model->train_step(testing::global_batch(8, static_cast<uint64_t>(step * 10 + get_rank())), *optim);
  }
  EXPECT_GE(ddp->reducer().bucket_indices().size(), 4u) << "the test needs several buckets";
  std::vector<torch::Tensor> weights;
  for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
  return weights;
}

LOCKSTEP_WORKER_TEST(CommHookWorker, PowerSGDOverTheHierarchyStaysInStep) {
  testing::WorkerWorld world_guard;
  auto hierarchical = train_with_powersgd("on");
  auto flat = train_with_powersgd("off");
  ASSERT_EQ(hierarchical.size(), flat.size());
  for (size_t i = 0; i < flat.size(); ++i) {
    expect_same_on_every_rank(hierarchical[i], "parameter " + std::to_string(i));
    EXPECT_TRUE(torch::allclose(hierarchical[i], flat[i], 1e-4, 1e-5))
        << "parameter " << i << ": largest difference " << (hierarchical[i] - flat[i]).abs().max().item<double>();
  }
}

TEST(CommHook, PowerSGDOverTheHierarchyStaysInStep) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto result = testing::run_workers(4, "CommHookWorker.PowerSGDOverTheHierarchyStaysInStep", {"LOCKSTEP_TIMEOUT_S=60"});
  EXPECT_WORKERS_OK(result);
}

TEST(CommHook, LegacyHookIsAcceptedAndSaysWhatChanged) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto result = testing::run_workers(2, "CommHookWorker.LegacyHookStillTrainsLikeOneProcess");
  EXPECT_WORKERS_OK(result);
  EXPECT_NE(result.output.find("comm hook 'legacy_sum' implements launch(group, bucket, index), the contract in which "
                               "DDP divided the bucket"),
            std::string::npos)
      << result.output;
}

TEST(CommHook, HierarchicalDdpMatchesOneProcess) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  for (const char* hook : {"", "allreduce"}) {
    auto result = testing::run_workers(4, "CommHookWorker.HierarchicalDdpMatchesOneProcess",
                                       {std::string("HIER_HOOK=") + hook});
    EXPECT_WORKERS_OK(result) << "hook '" << hook << "'";
    EXPECT_NE(result.output.find("DDP reduces gradients hierarchically: 2 nodes of 2, 2 ranks"), std::string::npos)
        << result.output;
  }
}

}  // namespace
}  // namespace lockstep
