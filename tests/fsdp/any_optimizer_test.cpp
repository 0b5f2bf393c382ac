// FSDP with an optimizer lockstep has never heard of: a test registers its own
// (testing::TinyMomentum, a libtorch optimizer written as a user would) on the
// optimizer registry and trains it through the Runner under FSDPStrategy. It
// trains to DDP's weights (within the FSDP bound, 1e-5), and a run
// interrupted after a checkpoint resumes bitwise, from a sharded checkpoint
// and from a full one (whose optimizer state is gathered, then sharded again).
// Before, FSDP counted the optimizer's memory by serialising its state with a
// codec that knew four optimizer types, and failed at step 1.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/config/config.h"
#include "lockstep/engine/hook.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/optim/optimizer_builder.h"
#include "lockstep/runner/runner.h"
#include "lockstep/strategy/strategy.h"
#include "tests/fsdp/fsdp_test_util.h"
#include "tests/support/multiprocess.h"
#include "tests/support/small_job.h"
#include "tests/support/tiny_momentum.h"

namespace lockstep {
namespace {

LOCKSTEP_REGISTER(optimizer_registry(), "TinyMomentum",
                  [](const Config& cfg, std::vector<torch::optim::OptimizerParamGroup> groups) {
                    return std::make_shared<testing::TinyMomentum>(std::move(groups),
                                                                   testing::TinyOptions(cfg.get<double>("lr")));
                  });

// Ends a run with an exception before iteration `iteration`, as a crash would.
struct ThrowBeforeIteration : Hook {
  explicit ThrowBeforeIteration(int64_t iteration) : Hook("ThrowBeforeIteration"), iteration_(iteration) {}
  void before_step() override {
    if (trainer().iter() == iteration_) throw Error("interrupted");
  }
  int64_t iteration_;
};
LOCKSTEP_REGISTER(hook_registry(), "ThrowBeforeIteration", [](const Config& config, const HookContext&) {
  return std::make_shared<ThrowBeforeIteration>(config.get<int64_t>("iteration"));
});

// The small job (tests/support/small_job.h), 12 iterations with the user's
// optimizer: checkpoints at 5 and 10.
const std::vector<std::string> kJobChanges{"optim_wrapper.optimizer={_delete_: true, type: TinyMomentum, lr: 0.05}",
                                           "param_scheduler=null", "train_cfg.max_iters=12"};

// Trains the job with `strategy` (and `extra` overrides) in a world of its
// own; returns the full model state (on every rank).
std::map<std::string, torch::Tensor> train(const std::string& strategy, const std::string& work_dir,
                                           const std::vector<std::string>& extra = {}, bool resume = false) {
  testing::WorkerWorld world;
  Config config = parse_config(testing::small_job_config(), "small_job.yaml");
  for (const auto& assignment : kJobChanges) config.apply_override(assignment);
  config.apply_override(strategy);
  for (const auto& assignment : extra) config.apply_override(assignment);
  Runner runner(config, RunnerOptions().work_dir(work_dir).resume(resume));
  try {
    runner.train();
  } catch (const Error& error) {
    if (std::string(error.what()) != "interrupted") throw;
    return {};
  }
  return runner.strategy().model_state_dict();
}

std::string fsdp(const std::string& state_dict_type) {
  return "strategy={type: FSDPStrategy, launcher: pytorch, backend: gloo, state_dict_type: " + state_dict_type +
         ", model_wrapper: {auto_wrap_policy: {type: module_type, module_types: [Linear]}}}";
}

LOCKSTEP_WORKER_TEST(FsdpAnyOptimizerWorker, TrainsLikeDdpAndResumesBitwise) {
  const std::string root = testing::env_or("FSDP_TEST_DIR");
  ASSERT_FALSE(root.empty());
  const bool main = testing::env_or("RANK", "0") == "0";
  auto ddp = train(testing::ddp_strategy_line(), root + "/ddp");
  auto straight = train(fsdp("sharded"), root + "/fsdp");
  if (main) testing::expect_matches(straight, ddp, 1e-5, 1e-6, "FSDP with TinyMomentum against DDP");
  for (const char* kind : {"sharded", "full"}) {
    const std::string dir = root + "/interrupted_" + kind;
    auto none = train(fsdp(kind), dir, {"custom_hooks=[{type: ThrowBeforeIteration, iteration: 8}]"});
    EXPECT_TRUE(none.empty());
    auto resumed = train(fsdp(kind), dir, {}, /*resume=*/true);
    if (main) testing::expect_matches(resumed, straight, 0, 0, std::string("resumed from a ") + kind + " checkpoint");
  }
}

TEST(FsdpAnyOptimizer, AnOptimizerOfTheUsersOwnTrainsLikeDdpAndResumesBitwise) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  testing::WorkersOptions options;
  options.env = {"FSDP_TEST_DIR=" + dir.path()};
  options.timeout_s = 300;
  auto result = testing::run_workers(2, "FsdpAnyOptimizerWorker.TrainsLikeDdpAndResumesBitwise", options);
  EXPECT_WORKERS_OK(result);
}

}  // namespace
}  // namespace lockstep
