// build_default_hooks: the hooks that a config's default_hooks section makes.
#include "lockstep/runner/default_hooks.h"

#include <gtest/gtest.h>

#include "lockstep/engine/checkpointer.h"
#include "lockstep/strategy/strategy.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

HookContext context_with_evaluation(const std::string& dir) {
  HookContext context;
  context.strategy = std::make_shared<SingleDeviceStrategy>();
  context.checkpointer = std::make_shared<Checkpointer>(context.strategy, dir);
  context.work_dir = dir;
  context.max_iters = 10;
  context.val_interval = 2;
  context.evaluate = [] { return std::map<std::string, double>{}; };
  return context;
}

std::vector<std::string> names_of(const std::vector<std::shared_ptr<Hook>>& hooks) {
  std::vector<std::string> names;
  for (const auto& hook : hooks) names.push_back(hook->name());
  return names;
}

TEST(DefaultHooks, SaveBestTakesAnyMetricName) {
  testing::TempDir dir;
  // A quote in the metric's name broke the hook's config when it was built
  // by pasting YAML text together.
  Config config = parse_config("checkpoint: {interval: 2, save_best: 'val/\"odd\" metric', rule: less}\n", "cfg.yaml");
  auto names = names_of(build_default_hooks(config, Config(), context_with_evaluation(dir.path())));
  EXPECT_NE(std::find(names.begin(), names.end(), "BestCheckpointer"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "EvalHook"), names.end());
}

TEST(DefaultHooks, SaveBestErrorsNameTheUsersFileAndLine) {
  testing::TempDir dir;
  Config bad_rule = parse_config("checkpoint:\n  interval: 2\n  save_best: accuracy/top1\n  rule: sideways\n", "cfg.yaml");
  const std::string error = testing::error_of([&] {
    build_default_hooks(bad_rule, Config(), context_with_evaluation(dir.path()));
  });
  EXPECT_NE(error.find("cfg.yaml:4"), std::string::npos) << error;
  EXPECT_NE(error.find("rule must be 'greater' or 'less'"), std::string::npos) << error;

  HookContext without_evaluation = context_with_evaluation(dir.path());
  without_evaluation.evaluate = nullptr;
  Config needs_eval = parse_config("checkpoint: {interval: 2, save_best: accuracy/top1}\n", "cfg.yaml");
  const std::string missing = testing::error_of([&] { build_default_hooks(needs_eval, Config(), without_evaluation); });
  EXPECT_NE(missing.find("cfg.yaml:1"), std::string::npos) << missing;
  EXPECT_NE(missing.find("save_best needs evaluation"), std::string::npos) << missing;
}

}  // namespace
}  // namespace lockstep
