// DistributedDataParallel across real processes (Gloo, CPU).
//
// Equivalence: each worker trains its slice of a global batch with DDP and,
// in the same process, a twin model on the whole batch with no
// communication; after 10 SGD-momentum steps both must hold the same
// parameters (rtol 1e-5, atol 1e-6).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/parallel/ddp/distributed_data_parallel.h"
#include "lockstep/parallel/sync_batchnorm.h"
#include "tests/parallel/ddp_models.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

using testing::DdpMlp;
using testing::TiedModel;

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string(value) == "1";
}

struct EquivalenceSetup {
  std::function<std::shared_ptr<Model>()> make_model;
  DDPOptions options;
  int64_t accumulation = 1;
  std::string comm_hook;  // none: DDP's own reduction

  bool sync_batchnorm = false;
  double rtol = 1e-5;
  double atol = 1e-6;
};

void run_equivalence(const EquivalenceSetup& setup) {
  testing::WorkerWorld world_guard;
  const int rank = get_rank();
  const int world_size = get_world_size();
  const int64_t per_rank = 6;  // uneven on purpose: not a power of two
  const int64_t steps = 10;
  torch::manual_seed(7);
  auto model = setup.make_model();
  torch::manual_seed(7);
  auto reference = setup.make_model();

  if (setup.sync_batchnorm) convert_sync_batchnorm(model);
  auto ddp = std::make_shared<DistributedDataParallel>(model, world(), setup.options);
  if (!setup.comm_hook.empty()) ddp->register_comm_hook(make_comm_hook(Config::scalar(setup.comm_hook)));
  auto optim = testing::sgd_momentum(*model, setup.accumulation);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, steps * setup.accumulation);
  auto reference_optim = testing::sgd_momentum(*reference);
  reference_optim->initialize_count_status(0, steps);

  const int64_t global = per_rank * world_size * setup.accumulation;
  for (int64_t step = 0; step < steps; ++step) {
    Batch batch = testing::global_batch(global, static_cast<uint64_t>(1000 + step));
    for (int64_t micro = 0; micro < setup.accumulation; ++micro) {
      model->train_step(batch.slice((micro * world_size + rank) * per_rank, per_rank), *optim);
    }
    reference->train_step(batch, *reference_optim);
  }
  testing::expect_same_state(*model, *reference, setup.rtol, setup.atol);
}

DDPOptions options_from_env() {
  return DDPOptions().gradient_as_bucket_view(env_flag("DDP_VIEW")).first_bucket_cap_mb(0.001).bucket_cap_mb(0.004);
}

// The plain MLP in each of DDP's four modes, gradient_as_bucket_view off and
// on, each with DDP's own reduction and through the allreduce hook: four
// equivalences, each in a world of its own, in one launch.
LOCKSTEP_WORKER_TEST(DdpWorker, MlpMatchesOneProcessInEachMode) {
  for (bool view : {false, true}) {
    for (const char* hook : {"", "allreduce"}) {
      SCOPED_TRACE(str_cat("gradient_as_bucket_view ", view, " hook '", hook, "'"));
      EquivalenceSetup setup{[] { return std::make_shared<DdpMlp>(); }, options_from_env().gradient_as_bucket_view(view)};
      setup.comm_hook = hook;
      run_equivalence(setup);
    }
  }
}

// With DDP's own reduction and through the allreduce hook, a world for each.
LOCKSTEP_WORKER_TEST(DdpWorker, UnusedParametersMatchOneProcess) {
  for (const char* hook : {"", "allreduce"}) {
    SCOPED_TRACE(str_cat("hook '", hook, "'"));
    EquivalenceSetup setup{[] { return std::make_shared<DdpMlp>(64, /*with_unused=*/true); },
                           options_from_env().find_unused_parameters(true)};
    setup.comm_hook = hook;
    run_equivalence(setup);
  }
}

LOCKSTEP_WORKER_TEST(DdpWorker, StaticGraphWithUnusedParametersMatchesOneProcess) {
  EquivalenceSetup setup{[] { return std::make_shared<DdpMlp>(64, /*with_unused=*/true); },
                         options_from_env().static_graph(true)};
  run_equivalence(setup);
}

LOCKSTEP_WORKER_TEST(DdpWorker, SyncBatchNormMatchesBatchNormInOneProcess) {
  EquivalenceSetup setup{[] { return std::make_shared<testing::BatchNormMlp>(); },
                         options_from_env().broadcast_buffers(false)};
  setup.sync_batchnorm = true;
  run_equivalence(setup);
}

LOCKSTEP_WORKER_TEST(DdpWorker, TiedParametersMatchOneProcess) {
  run_equivalence({[] { return std::make_shared<TiedModel>(); }, options_from_env()});
}

LOCKSTEP_WORKER_TEST(DdpWorker, AccumulationWithNoSyncMatchesOneProcess) {
  EquivalenceSetup setup{[] { return std::make_shared<DdpMlp>(); }, options_from_env()};
  setup.accumulation = 4;
  run_equivalence(setup);
}

// DDP through a compressing comm hook, compared with one process within the
// compression's tolerance.
void run_compressed(const std::string& comm_hook, double rtol, double atol) {
  EquivalenceSetup setup{[] { return std::make_shared<DdpMlp>(); }, options_from_env()};
  setup.comm_hook = comm_hook;
  setup.rtol = rtol;
  setup.atol = atol;
  run_equivalence(setup);
}

LOCKSTEP_WORKER_TEST(DdpWorker, Bf16CompressionStaysWithinItsTolerance) {
  run_compressed("bf16_compress", 2e-2, 2e-3);
}

LOCKSTEP_WORKER_TEST(DdpWorker, Fp16CompressionStaysWithinItsTolerance) {
  run_compressed("fp16_compress", 5e-3, 5e-4);
}

// A parameter used on some ranks and unused on others: rank 0's slices flag
// samples for the auxiliary head in some micro-steps, the other ranks' never.
// Against one process that adds every rank's and micro-step's loss (each
// divided by world size x accumulation) and steps once.
void run_rank_dependent_usage_once(int64_t accumulation, bool view) {
  testing::WorkerWorld world_guard;
  const int rank = get_rank();
  const int world_size = get_world_size();
  const int64_t per_rank = 6;
  const int64_t steps = 6;
  torch::manual_seed(11);
  auto model = std::make_shared<testing::SometimesAuxMlp>();
  torch::manual_seed(11);
  auto reference = std::make_shared<testing::SometimesAuxMlp>();
  auto ddp = std::make_shared<DistributedDataParallel>(
      model, world(), options_from_env().gradient_as_bucket_view(view).find_unused_parameters(true));
  auto optim = testing::sgd_momentum(*model, accumulation);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, steps * accumulation);
  auto reference_optim = testing::sgd_momentum(*reference);
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t global = per_rank * world_size * accumulation;
    Batch batch = testing::global_batch(global, static_cast<uint64_t>(500 + step));
    torch::Tensor flags = torch::zeros({global}, torch::kBool);
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      // Rank 0 uses the head in every other micro-step of even steps (and in odd steps never).
      if (step % 2 == 0 && micro % 2 == 0) flags[(micro * world_size) * per_rank + 1] = true;
    }
    batch.set("aux", flags);
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      model->train_step(batch.slice((micro * world_size + rank) * per_rank, per_rank), *optim);
    }
    torch::Tensor total = torch::zeros({});
    for (int64_t slice = 0; slice < world_size * accumulation; ++slice) {
      LossDict losses = reference->loss(batch.slice(slice * per_rank, per_rank));
      for (const auto& item : losses) total = total + item.value();
    }
    reference_optim->update_params(total / static_cast<double>(world_size * accumulation));
  }
  testing::expect_same_state(*model, *reference, 1e-5, 1e-6);
}

// With gradient_as_bucket_view off and on, a world for each.
void run_rank_dependent_usage(int64_t accumulation) {
  for (bool view : {false, true}) {
    SCOPED_TRACE(str_cat("gradient_as_bucket_view ", view));
    run_rank_dependent_usage_once(accumulation, view);
  }
}

LOCKSTEP_WORKER_TEST(DdpWorker, ParameterUsedOnSomeRanksMatchesOneProcess) { run_rank_dependent_usage(1); }

LOCKSTEP_WORKER_TEST(DdpWorker, ParameterUsedOnSomeRanksWithNoSyncMicroStepsMatchesOneProcess) {
  run_rank_dependent_usage(4);
}

TEST(Ddp, ParameterUsedOnSomeRanksOnly) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::expect_each_worker_ok(2, {"DdpWorker.ParameterUsedOnSomeRanksMatchesOneProcess",
                                     "DdpWorker.ParameterUsedOnSomeRanksWithNoSyncMicroStepsMatchesOneProcess"});
}

// A custom train_step that runs loss.backward() itself, outside the optim
// wrapper, would train each rank on its own: DDP fails instead, naming the
// parameter and the fix. Inside no_sync() local accumulation stays allowed.
LOCKSTEP_WORKER_TEST(DdpWorker, BackwardOutsideTheOptimWrapperFails) {
  testing::WorkerWorld world_guard;
  torch::manual_seed(3);
  auto model = std::make_shared<DdpMlp>();
  auto ddp = std::make_shared<DistributedDataParallel>(model, world());
  auto optim = testing::sgd_momentum(*model);
  optim->set_gradient_sync(ddp);
  Batch batch = testing::global_batch(8, 1);
  {
    auto local = ddp->no_sync();
    model->loss(batch)["loss"].backward();  // allowed: accumulates locally
  }
  optim->zero_grad();
  try {
    model->loss(batch)["loss"].backward();
    ADD_FAILURE() << "a backward DDP was not told about trained each rank on its own";
  } catch (const std::exception& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("received a gradient from a backward pass DDP was not told about"), std::string::npos)
        << message;
    EXPECT_NE(message.find("optim_wrapper.update_params(loss)"), std::string::npos) << message;
  }
}

// The one-time bucket rebuild happens when the second forward begins, not
// after it (when activations fill memory).
LOCKSTEP_WORKER_TEST(DdpWorker, BucketsAreRebuiltBeforeTheSecondForward) {
  testing::WorkerWorld world_guard;
  torch::manual_seed(1);
  auto model = std::make_shared<DdpMlp>(512);
  auto ddp = std::make_shared<DistributedDataParallel>(model, world(),
                                                       DDPOptions().first_bucket_cap_mb(0.001).bucket_cap_mb(0.01));
  auto optim = testing::sgd_momentum(*model);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, 3);
  model->train_step(testing::global_batch(64, 5), *optim);
  EXPECT_FALSE(ddp->reducer().buckets_rebuilt());
  {
    auto context = optim->optim_context();
    EXPECT_TRUE(ddp->reducer().buckets_rebuilt()) << "the rebuild waited for the backward pass";
    model->loss(testing::global_batch(64, 6));
  }
  EXPECT_TRUE(ddp->reducer().buckets_rebuilt());
}

TEST(Ddp, CustomBackwardAndBucketRebuild) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::WorkersOptions options;
  options.env = {"LOCKSTEP_TIMEOUT_S=20"};
  options.timeout_s = 90;
  testing::expect_each_worker_ok(
      2, {"DdpWorker.BackwardOutsideTheOptimWrapperFails", "DdpWorker.BucketsAreRebuiltBeforeTheSecondForward"},
      options);
}

// gradient_as_bucket_view changes where gradients live, not their bits. On 3
// ranks (1/3 is inexact) both modes must divide the same way: zero_grad drops
// the gradients, as PyTorch's zero_grad(set_to_none=True), so the next
// backward copies each into its bucket multiplied by 1/3 (PyTorch's reducer)
// in either mode. (When zero_grad zeroed bucket views in place, gradients were
// added to them and the bucket divided by 3: other bits.) With views, every
// gradient aliases its bucket once reduced, as the option promises.
LOCKSTEP_WORKER_TEST(DdpWorker, BucketViewsHoldTheBitsOfCopiedGradients) {
  testing::WorkerWorld world_guard;
  const int rank = get_rank();
  std::vector<std::shared_ptr<Model>> models;
  std::vector<std::shared_ptr<DistributedDataParallel>> ddps;
  std::vector<std::shared_ptr<OptimWrapper>> optims;
  for (bool view : {false, true}) {
    torch::manual_seed(5);
    models.push_back(std::make_shared<DdpMlp>());
    ddps.push_back(std::make_shared<DistributedDataParallel>(
        models.back(), world(), DDPOptions().gradient_as_bucket_view(view).first_bucket_cap_mb(0.001).bucket_cap_mb(0.004)));
    optims.push_back(testing::sgd_momentum(*models.back()));
    optims.back()->set_gradient_sync(ddps.back());
    optims.back()->initialize_count_status(0, 4);
  }
  for (int64_t step = 0; step < 4; ++step) {
    Batch batch = testing::global_batch(6 * get_world_size(), static_cast<uint64_t>(300 + step)).slice(rank * 6, 6);
    for (size_t m = 0; m < models.size(); ++m) {
      auto context = optims[m]->optim_context();
      optims[m]->backward(parse_losses(models[m]->loss(batch)).loss);
      if (m == 1) {
        auto params = models[m]->parameters();
        for (const auto& bucket : ddps[m]->reducer().bucket_indices()) {
          for (size_t index : bucket) {
            EXPECT_EQ(params[index].grad().storage().data_ptr().get(),
                      params[bucket.front()].grad().storage().data_ptr().get())
                << "step " << step << ": parameter " << index << "'s gradient is not a view of its bucket";
          }
        }
      }
      optims[m]->step();
      optims[m]->zero_grad();
    }
  }
  auto copied = models[0]->named_parameters();
  auto viewed = models[1]->named_parameters();
  for (const auto& item : copied) {
    EXPECT_TRUE(torch::equal(item.value(), viewed[item.key()])) << item.key() << " differs between the two modes";
  }
}

TEST(Ddp, BucketViewsHoldTheBitsOfCopiedGradientsOnThreeRanks) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto result = testing::run_workers(3, "DdpWorker.BucketViewsHoldTheBitsOfCopiedGradients");
  EXPECT_WORKERS_OK(result);
}

// Each rank count in one launch: every equivalence of this file, the MLP's
// in each of DDP's modes (MlpMatchesOneProcessInEachMode), the others with
// gradient_as_bucket_view (DDP_VIEW=1), find_unused_parameters also through
// the allreduce hook.
TEST(Ddp, EquivalenceOnTwoAndFourRanks) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  for (int nproc : {2, 4}) {
    testing::expect_each_worker_ok(nproc,
                                   {"DdpWorker.MlpMatchesOneProcessInEachMode",
                                    "DdpWorker.UnusedParametersMatchOneProcess",
                                    "DdpWorker.TiedParametersMatchOneProcess",
                                    "DdpWorker.SyncBatchNormMatchesBatchNormInOneProcess",
                                    "DdpWorker.AccumulationWithNoSyncMatchesOneProcess",
                                    "DdpWorker.StaticGraphWithUnusedParametersMatchesOneProcess"},
                                   {"DDP_VIEW=1"}, " on " + std::to_string(nproc) + " ranks");
  }
}

TEST(Ddp, CompressionHooks) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::expect_each_worker_ok(
      2, {"DdpWorker.Bf16CompressionStaysWithinItsTolerance", "DdpWorker.Fp16CompressionStaysWithinItsTolerance"});
}

LOCKSTEP_WORKER_TEST(DdpWorker, LaunchesBucketsBeforeBackwardEnds) {
  testing::WorkerWorld world_guard;
  torch::manual_seed(1);
  auto model = std::make_shared<DdpMlp>(512);
  auto ddp = std::make_shared<DistributedDataParallel>(model, world(), DDPOptions().first_bucket_cap_mb(0.001).bucket_cap_mb(0.01));
  auto optim = testing::sgd_momentum(*model);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, 3);
  for (int step = 0; step < 3; ++step) model->train_step(testing::global_batch(64, 5), *optim);
  ReductionTimeline timeline = ddp->reducer().last_timeline();
  ASSERT_GE(timeline.bucket_launched.size(), 2u) << "the test needs several buckets";
  EXPECT_TRUE(ddp->reducer().buckets_rebuilt());
  // Bucket 0 went out while autograd was still producing gradients for the
  // earlier layers, and every bucket before the final callback.
  EXPECT_LT(timeline.bucket_launched.front(), timeline.last_hook);
  // The iteration check left before the first bucket: no round trip of its
  // own at the end of backward.
  EXPECT_LT(timeline.check_launched, timeline.bucket_launched.front());
  for (const auto& launched : timeline.bucket_launched) EXPECT_LE(launched, timeline.backward_finished);
}

TEST(Ddp, CommunicationOverlapsBackward) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto result = testing::run_workers(2, "DdpWorker.LaunchesBucketsBeforeBackwardEnds");
  EXPECT_WORKERS_OK(result);
}

LOCKSTEP_WORKER_TEST(DdpWorker, ShapeMismatchFailsOnEveryRank) {
  testing::WorkerWorld world_guard;
  auto model = std::make_shared<DdpMlp>(get_rank() == 1 ? 32 : 64);
  const std::string message = testing::error_of([&] { DistributedDataParallel ddp(model, world()); });
  EXPECT_NE(message.find("parameter 'fc1.weight' has shape [64, 16] on rank 0 but [32, 16] on rank 1"),
            std::string::npos) << message;
}

void skip_a_step_on_rank_one(bool find_unused) {
  testing::WorkerWorld world_guard;
  torch::manual_seed(3);
  auto model = std::make_shared<DdpMlp>();
  auto ddp = std::make_shared<DistributedDataParallel>(model, world(), DDPOptions().find_unused_parameters(find_unused));
  auto optim = testing::sgd_momentum(*model);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, 6);
  const std::string message = testing::error_of([&] {
    for (int step = 0; step < 6; ++step) {
      if (get_rank() == 1 && step == 2) continue;  // this rank skips a whole step
      // As the Trainer does: the step knows its iteration.
      model->run_train_step(testing::global_batch(8, static_cast<uint64_t>(step)), *optim, {step, {}});
    }
  });
  EXPECT_NE(message.find("DDP ranks are out of step"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 at iteration 2, rank 1 at iteration 3"), std::string::npos) << message;
}

// The check leaves with the start of backward; with a used map to exchange
// (find_unused_parameters) it leaves after the last bucket. Both must name
// the ranks; each in a world of its own.
LOCKSTEP_WORKER_TEST(DdpWorker, SkippedStepIsNamedOnEveryRank) {
  for (bool find_unused : {false, true}) {
    SCOPED_TRACE(str_cat("find_unused_parameters ", find_unused));
    skip_a_step_on_rank_one(find_unused);
  }
}

LOCKSTEP_WORKER_TEST(DdpWorker, ForwardWithoutBackwardFailsEveryRank) {
  testing::WorkerWorld world_guard;
  auto model = std::make_shared<DdpMlp>();
  auto ddp = std::make_shared<DistributedDataParallel>(model, world());
  auto optim = testing::sgd_momentum(*model);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, 6);
  try {
    for (int step = 0; step < 6; ++step) {
      Batch batch = testing::global_batch(8, static_cast<uint64_t>(step));
      if (get_rank() == 1 && step == 2) {
        auto context = optim->optim_context();
        model->loss(batch);  // a forward whose backward never comes
        continue;
      }
      model->train_step(batch, *optim);
    }
    ADD_FAILURE() << "a rank skipped backward unnoticed";
  } catch (const Error& error) {
    std::string message = error.what();
    if (get_rank() == 1) {
      EXPECT_NE(message.find("never ran backward"), std::string::npos) << message;
    } else {
      // Rank 0 waits in its reduction until rank 1 leaves (or the timeout): either way, an error.
      EXPECT_FALSE(message.empty());
    }
    std::cerr << "rank " << get_rank() << " error: " << message << std::endl;
  }
}

TEST(Ddp, MismatchesFailOnEveryRankWithoutHanging) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::WorkersOptions options;
  options.env = {"LOCKSTEP_TIMEOUT_S=20"};
  options.timeout_s = 90;
  testing::expect_each_worker_ok(2, {"DdpWorker.ShapeMismatchFailsOnEveryRank", "DdpWorker.SkippedStepIsNamedOnEveryRank",
                                     "DdpWorker.ForwardWithoutBackwardFailsEveryRank"},
                                 options);
}

}  // namespace
}  // namespace lockstep
