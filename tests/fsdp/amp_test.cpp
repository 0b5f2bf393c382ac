// Mixed precision (AmpOptimWrapper: bf16 autocast, dynamic loss scaling)
// under FullyShardedDataParallel, across real processes.
//
// Each rank's GradScaler sees only its shards' gradients, so an inf/NaN in
// one shard is known to one rank alone: FSDP's GradientSync::any_rank_true
// must carry it to every rank (a "sharded" scaler), or that rank skips the
// step while the others take it and the shards stop belonging to one model.
// The inf is injected into ONE rank's sharded gradient after the
// reduce-scatter; every rank must skip that step and halve the scale. Clean
// steps grow the scale everywhere and match one process on the whole batch
// (bf16 tolerance).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/amp/amp_optim_wrapper.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/process_group.h"
#include "tests/fsdp/fsdp_test_util.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

constexpr int64_t kBadStep = 2;

// SGD: its step is linear in the gradient, so bf16 rounding stays bf16-sized
// (Adam normalises small gradients, and their bf16 noise, to steps of size lr).
std::shared_ptr<AmpOptimWrapper> make_amp(std::vector<torch::Tensor> params, int64_t growth_interval) {
  auto sgd = std::make_shared<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_shared<AmpOptimWrapper>(
      sgd, OptimWrapperOptions(),
      AmpOptions().dtype(torch::kBFloat16).loss_scale(GradScalerOptions().growth_interval(growth_interval)));
}

torch::Tensor flat_shards(const FullyShardedDataParallel& fsdp) {
  std::vector<torch::Tensor> flat;
  for (const auto& shard : fsdp.shard_parameters()) flat.push_back(shard.detach().flatten());
  return torch::cat(flat);
}

// Every rank holds the same `values` as rank 0.
void expect_same_on_every_rank(const torch::Tensor& values, const std::string& what) {
  std::vector<torch::Tensor> all;
  world()->all_gather(all, values);
  for (size_t r = 1; r < all.size(); ++r) EXPECT_TRUE(torch::equal(all[r], all[0])) << what << ": rank " << r;
}

struct AmpRun {
  std::vector<double> scales;
  std::map<std::string, torch::Tensor> weights;  // on rank 0
};

// FSDP + AmpOptimWrapper on the MLP for `steps` steps; with `inject`, the
// last rank's first block shard gets an inf gradient at kBadStep.
AmpRun train(ShardingStrategy strategy, int64_t steps, int64_t growth_interval, bool inject) {
  const int rank = get_rank();
  const int bad_rank = get_world_size() - 1;
  auto model = testing::make_model("mlp");
  auto fsdp = std::make_shared<FullyShardedDataParallel>(
      model, world(),
      FSDPOptions().sharding_strategy(strategy).hybrid_shard_size(2).auto_wrap_policy(testing::policy_for("mlp")));
  auto optim = make_amp(fsdp->shard_parameters(), growth_interval);
  optim->set_gradient_sync(fsdp);
  optim->initialize_count_status(0, steps);
  int64_t step = 0;
  const StepContext injection{-1, [&] {
    if (!inject || rank != bad_rank || step != kBadStep) return;
    torch::NoGradGuard no_grad;
    fsdp->units().at(1)->shard().mutable_grad()[0] = INFINITY;
  }};
  AmpRun run;
  for (step = 0; step < steps; ++step) {
    Batch global = testing::global_batch("mlp", testing::kPerRank * get_world_size(), static_cast<uint64_t>(500 + step));
    torch::Tensor before = flat_shards(*fsdp);
    model->run_train_step(global.slice(rank * testing::kPerRank, testing::kPerRank), *optim, injection);
    const bool changed = !torch::equal(before, flat_shards(*fsdp));
    EXPECT_EQ(changed, !(inject && step == kBadStep)) << "rank " << rank << " step " << step;
    run.scales.push_back(optim->grad_scaler()->get_scale());
  }
  expect_same_on_every_rank(torch::tensor(run.scales, torch::kDouble), "loss scales");
  run.weights = fsdp->full_state_dict(/*rank0_only=*/true);
  return run;
}

void inf_on_one_rank_skips_everywhere(ShardingStrategy strategy) {
  SCOPED_TRACE(std::string("inf in one rank's shard, ") + to_string(strategy));
  AmpRun run = train(strategy, 5, /*growth_interval=*/1000, /*inject=*/true);
  EXPECT_EQ(run.scales, (std::vector<double>{65536, 65536, 32768, 32768, 32768})) << "rank " << get_rank();
}

void clean_steps_grow_the_scale_and_match_one_process() {
  SCOPED_TRACE("clean AMP steps under FULL_SHARD");
  const int64_t steps = 6;
  AmpRun run = train(ShardingStrategy::kFullShard, steps, /*growth_interval=*/3, /*inject=*/false);
  EXPECT_EQ(run.scales, (std::vector<double>{65536, 65536, 131072, 131072, 131072, 262144}));
  if (get_rank() != 0) return;
  auto reference = testing::make_model("mlp");
  auto optim = make_amp(testing::unique_parameters(*reference), 3);
  for (int64_t step = 0; step < steps; ++step) {
    reference->train_step(
        testing::global_batch("mlp", testing::kPerRank * get_world_size(), static_cast<uint64_t>(500 + step)), *optim);
  }
  testing::expect_matches(run.weights, testing::parameters_of(*reference), 2e-2, 2e-3, "AMP under FSDP vs one process");
}

// A float16 reduction divides before it sums, as PyTorch's FSDP does (by 2
// of N=2, 2 of N=4, then by the rest): a gradient g on every rank then
// reduces to g as long as g * N / predivide fits float16. Summing first would
// overflow from g > 65504 / N. With g = 40000 (N=2) or 20000 (N=4) each rank's
// sum would be 80000 > 65504, an inf; divided first it is g exactly.
struct Scaled : Model {
  // 8 elements: no padding on 2 or 4 ranks.
  Scaled() { weight = register_parameter("weight", torch::ones({8})); }
  LossDict loss(const Batch& data) override {
    LossDict losses;
    losses.insert("loss", (weight * data.at("g")).sum());  // d loss / d weight = g
    return losses;
  }
  Batch predict(const Batch&) override { return {}; }
  torch::Tensor weight;
};

void fp16_reduction_divides_before_summing(ShardingStrategy strategy) {
  SCOPED_TRACE(to_string(strategy));
  const double g = get_world_size() == 2 ? 40000 : 20000;
  auto model = std::make_shared<Scaled>();
  auto fsdp = std::make_shared<FullyShardedDataParallel>(
      model, world(),
      FSDPOptions().sharding_strategy(strategy).hybrid_shard_size(2).mixed_precision(
          MixedPrecision().reduce_dtype(torch::kHalf)));
  auto optim = std::make_shared<OptimWrapper>(
      std::make_shared<torch::optim::SGD>(fsdp->shard_parameters(), torch::optim::SGDOptions(0.0)));
  optim->set_gradient_sync(fsdp);
  optim->backward(model->loss(Batch{{"g", torch::full({8}, g)}})["loss"]);
  for (const auto& shard : fsdp->shard_parameters()) {
    torch::Tensor grad = shard.grad();
    ASSERT_TRUE(grad.defined());
    EXPECT_TRUE(torch::equal(grad, torch::full_like(grad, g))) << grad;
  }
}

LOCKSTEP_WORKER_TEST(FsdpWorker, Fp16ReductionDividesBeforeSumming) {
  testing::WorkerWorld world_guard;
  fp16_reduction_divides_before_summing(ShardingStrategy::kFullShard);
  fp16_reduction_divides_before_summing(ShardingStrategy::kNoShard);
  if (get_world_size() == 4) fp16_reduction_divides_before_summing(ShardingStrategy::kHybridShard);
}

LOCKSTEP_WORKER_TEST(FsdpWorker, AmpSkipsTheSameStepsOnEveryRank) {
  testing::WorkerWorld world_guard;
  inf_on_one_rank_skips_everywhere(ShardingStrategy::kFullShard);
  if (get_world_size() == 4) inf_on_one_rank_skips_everywhere(ShardingStrategy::kHybridShard);
  clean_steps_grow_the_scale_and_match_one_process();
}

}  // namespace
}  // namespace lockstep
