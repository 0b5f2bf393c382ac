// Building a model unit by unit under FSDP (shard_while_building.h), on 2 and
// 4 ranks (a worker of fsdp_test.cpp's launches): examples/gpt's GPT built
// inside a ShardWhileBuilding scope holds, once wrapped, exactly the values of
// the same GPT built whole and then wrapped, for the same seed, and trains to
// the same bits; while it is built no block keeps its parameters (each rank
// holds its shard of each block only); and a shard cut for another layout is
// refused with a message naming the unit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/fsdp/shard_while_building.h"
#include "tests/fsdp/fsdp_test_util.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

constexpr uint64_t kSeed = 11;
constexpr int64_t kTrainSteps = 3;

std::shared_ptr<gpt::GPT> gpt_model() {
  torch::manual_seed(kSeed);
  return std::make_shared<gpt::GPT>(testing::tiny_gpt_options());
}

// Wraps `model`, trains kTrainSteps of Adam on each rank's slice, and returns
// the full state dict before and after (on every rank).
std::pair<std::map<std::string, torch::Tensor>, std::map<std::string, torch::Tensor>> wrap_and_train(
    std::shared_ptr<gpt::GPT> model, const FSDPOptions& options) {
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), options);
  auto before = fsdp->full_state_dict(/*rank0_only=*/false);
  auto optim = testing::adam(fsdp->shard_parameters());
  optim->set_gradient_sync(fsdp);
  optim->initialize_count_status(0, kTrainSteps);
  const int64_t global = testing::kPerRank * get_world_size();
  for (int64_t step = 0; step < kTrainSteps; ++step) {
    Batch batch = testing::global_batch("gpt", global, static_cast<uint64_t>(2000 + step));
    model->train_step(batch.slice(get_rank() * testing::kPerRank, testing::kPerRank), *optim);
  }
  return {before, fsdp->full_state_dict(/*rank0_only=*/false)};
}

void expect_bitwise(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, value] : a) {
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    EXPECT_TRUE(torch::equal(value, b.at(name))) << what << ": " << name;
  }
}

struct BuildCase {
  std::string name;
  FSDPOptions options;
};

std::vector<BuildCase> build_cases(int world_size) {
  std::vector<BuildCase> cases{
      {"FULL_SHARD", FSDPOptions().sharding_strategy(ShardingStrategy::kFullShard)},
      {"SHARD_GRAD_OP", FSDPOptions().sharding_strategy(ShardingStrategy::kShardGradOp)},
      {"NO_SHARD", FSDPOptions().sharding_strategy(ShardingStrategy::kNoShard)},
  };
  if (world_size == 4) {
    cases.push_back({"HYBRID_SHARD 2x2",
                     FSDPOptions().sharding_strategy(ShardingStrategy::kHybridShard).hybrid_shard_size(2)});
  }
  return cases;
}

LOCKSTEP_WORKER_TEST(FsdpWorker, ShardWhileBuildingEqualsBuiltWhole) {
  testing::WorkerWorld world_guard;
  for (const auto& c : build_cases(get_world_size())) {
    SCOPED_TRACE(c.name + " on " + std::to_string(get_world_size()) + " ranks");
    // Built whole, units chosen by the wrap policy.
    const auto whole = wrap_and_train(gpt_model(), FSDPOptions(c.options).auto_wrap_policy(testing::policy_for("gpt")));

    // Built unit by unit: no policy; the blocks are units because they were cut while building.
    std::shared_ptr<gpt::GPT> model;
    const fsdp::ShardPlan plan = FullyShardedDataParallel::shard_plan(c.options, world(), torch::kCPU);
    {
      fsdp::ShardWhileBuilding scope(plan);
      model = gpt_model();
    }
    for (const auto& block : *model->blocks) {
      EXPECT_TRUE(fsdp::has_prebuilt_shard(block.get()));
      for (const auto& param : block->parameters()) {
        EXPECT_LE(param.storage().nbytes(), param.element_size()) << "a block kept its parameters while building";
      }
    }
    const auto built = wrap_and_train(model, c.options);
    EXPECT_FALSE(fsdp::has_prebuilt_shard(model->blocks->ptr(0).get())) << "FSDP took the shards";
    expect_bitwise(whole.first, built.first, "initial values");
    expect_bitwise(whole.second, built.second, "after training");
  }
}

LOCKSTEP_WORKER_TEST(FsdpWorker, ShardCutForAnotherLayoutIsRefused) {
  testing::WorkerWorld world_guard;
  std::shared_ptr<gpt::GPT> model;
  {
    // Cut as if for one rank, wrapped over all of them.
    fsdp::ShardWhileBuilding scope(fsdp::ShardPlan{});
    model = gpt_model();
  }
  try {
    FullyShardedDataParallel fsdp(model, world(), FSDPOptions());
    ADD_FAILURE() << "a shard cut for another layout was accepted";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), ::testing::HasSubstr("FSDP unit 'blocks.0' was sharded while building as shard 0 of 1, "
                                                   "but this FSDP holds shard " +
                                                   std::to_string(get_rank()) + " of " +
                                                   std::to_string(get_world_size())));
  }
}

}  // namespace
}  // namespace lockstep
