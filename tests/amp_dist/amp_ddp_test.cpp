// Mixed precision under DistributedDataParallel, across real processes.
//
// Every rank must skip the same steps and keep the same loss scale, or the
// replicas drift apart. An inf/NaN is injected on ONE rank only: into its
// input (the all-reduce carries it to every rank's gradients) and into its
// gradient after the reduction (only GradientSync::any_rank_true can tell
// the other rank). Both ranks must skip that step, halve the scale, and end
// with identical parameters. Clean steps grow the scale on both, and the
// result matches one process training on the whole batch (bf16 tolerance).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/amp/amp_optim_wrapper.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/ddp/distributed_data_parallel.h"
#include "tests/parallel/ddp_models.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

using testing::DdpMlp;

// DDP whose ranks agree on a flag with a MAX all-reduce: the override a
// wrapper needs when its ranks' gradients can differ after end_backward.
class AgreeingDdp : public DistributedDataParallel {
 public:
  using DistributedDataParallel::DistributedDataParallel;
  torch::Tensor any_rank_true(const torch::Tensor& local) override {
    torch::Tensor flag = local.clone();
    process_group().all_reduce(flag, ReduceOp::kMax);
    return flag;
  }
};

enum class Injection { kNone, kInput, kGradientAfterReduction };

constexpr int64_t kPerRank = 6;
constexpr int kBadRank = 1;
constexpr int64_t kBadStep = 2;

std::shared_ptr<AmpOptimWrapper> make_amp(torch::nn::Module& model, int64_t growth_interval) {
  auto sgd = std::make_shared<torch::optim::SGD>(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_shared<AmpOptimWrapper>(
      sgd, OptimWrapperOptions(),
      AmpOptions().dtype(torch::kBFloat16).loss_scale(GradScalerOptions().growth_interval(growth_interval)));
}

torch::Tensor flat_parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().flatten());
  return torch::cat(flat);
}

// Max over ranks of |this rank's value - rank 0's|: 0 when every rank agrees.
double max_disagreement(torch::Tensor values) {
  torch::Tensor reference = values.clone();
  world()->broadcast(reference, 0);
  torch::Tensor difference = (values - reference).abs().max().reshape({1});
  world()->all_reduce(difference, ReduceOp::kMax);
  return difference.item<double>();
}

// Trains `steps` steps of DDP + AmpOptimWrapper (bf16 autocast, dynamic
// scaling) and returns the loss scale after each step.
std::vector<double> train(Injection injection, int64_t steps, int64_t growth_interval, std::shared_ptr<DdpMlp>& model) {
  const int rank = get_rank();
  torch::manual_seed(7);
  model = std::make_shared<DdpMlp>();
  std::shared_ptr<DistributedDataParallel> ddp =
      injection == Injection::kGradientAfterReduction ? std::make_shared<AgreeingDdp>(model, world())
                                                      : std::make_shared<DistributedDataParallel>(model, world());
  auto optim = make_amp(*model, growth_interval);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, steps);
  int64_t step = 0;
  const StepContext inject{-1, [&] {
    if (injection == Injection::kGradientAfterReduction && rank == kBadRank && step == kBadStep) {
      torch::NoGradGuard no_grad;
      model->fc2->weight.mutable_grad()[0][0] = INFINITY;
    }
  }};
  std::vector<double> scales;
  for (step = 0; step < steps; ++step) {
    Batch global = testing::global_batch(kPerRank * get_world_size(), static_cast<uint64_t>(500 + step));
    Batch local = global.slice(rank * kPerRank, kPerRank);
    if (injection == Injection::kInput && rank == kBadRank && step == kBadStep) {
      torch::Tensor x = local.at("x").clone();
      x[0][0] = INFINITY;
      local.set("x", x);
    }
    torch::Tensor before = flat_parameters(*model);
    model->run_train_step(local, *optim, inject);
    const bool changed = !torch::equal(before, flat_parameters(*model));
    const bool poisoned = injection != Injection::kNone && step == kBadStep;
    EXPECT_EQ(changed, !poisoned) << "rank " << rank << " step " << step;
    scales.push_back(optim->grad_scaler()->get_scale());
  }
  EXPECT_EQ(max_disagreement(flat_parameters(*model)), 0.0) << "the replicas drifted apart";
  EXPECT_EQ(max_disagreement(torch::tensor(scales, torch::kDouble)), 0.0) << "the ranks' loss scales differ";
  return scales;
}

void expect_skip_everywhere(Injection injection) {
  testing::WorkerWorld world_guard;
  std::shared_ptr<DdpMlp> model;
  std::vector<double> scales = train(injection, 5, /*growth_interval=*/1000, model);
  EXPECT_EQ(scales, (std::vector<double>{65536, 65536, 32768, 32768, 32768})) << "rank " << get_rank();
}

LOCKSTEP_WORKER_TEST(AmpDdpWorker, InfInOneRanksInputSkipsTheStepEverywhere) {
  expect_skip_everywhere(Injection::kInput);
}

LOCKSTEP_WORKER_TEST(AmpDdpWorker, InfInOneRanksReducedGradientSkipsTheStepEverywhere) {
  expect_skip_everywhere(Injection::kGradientAfterReduction);
}

LOCKSTEP_WORKER_TEST(AmpDdpWorker, CleanStepsGrowTheScaleAndMatchOneProcess) {
  testing::WorkerWorld world_guard;
  const int64_t steps = 6;
  std::shared_ptr<DdpMlp> model;
  std::vector<double> scales = train(Injection::kNone, steps, /*growth_interval=*/3, model);
  EXPECT_EQ(scales, (std::vector<double>{65536, 65536, 131072, 131072, 131072, 262144}));
  // One process, the whole batch, the same mixed precision.
  torch::manual_seed(7);
  auto reference = std::make_shared<DdpMlp>();
  auto optim = make_amp(*reference, 3);
  for (int64_t step = 0; step < steps; ++step) {
    reference->train_step(testing::global_batch(kPerRank * get_world_size(), static_cast<uint64_t>(500 + step)), *optim);
  }
  testing::expect_same_state(*model, *reference, 2e-2, 2e-3);
}

TEST(AmpDdp, InfOnOneRankSkipsTheStepOnEveryRankAndHalvesTheScale) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::expect_each_worker_ok(2, {"AmpDdpWorker.InfInOneRanksInputSkipsTheStepEverywhere",
                                     "AmpDdpWorker.InfInOneRanksReducedGradientSkipsTheStepEverywhere"});
}

TEST(AmpDdp, CleanStepsGrowTheScaleOnEveryRankAndMatchOneProcess) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto result = testing::run_workers(2, "AmpDdpWorker.CleanStepsGrowTheScaleAndMatchOneProcess");
  EXPECT_WORKERS_OK(result);
}

}  // namespace
}  // namespace lockstep
