// MemoryStatsHook, SyncBuffersHook and EmptyCacheHook inside a real Trainer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/empty_cache_hook.h"
#include "lockstep/hooks/hooks_test_util.h"
#include "lockstep/hooks/memory_stats_hook.h"
#include "lockstep/hooks/sync_buffers_hook.h"
#include "lockstep/models/classifiers.h"

namespace lockstep {
namespace {

struct SmallRun {
  SmallRun() {
    torch::manual_seed(0);
    model = std::make_shared<ConvNet>(ConvNetOptions().in_channels(1).image_size(8).channels({2, 4}).hidden(8).batch_norm(true));
    rig = std::make_unique<testing::TrainerRig>(model, /*examples=*/16, /*side=*/8);
  }
  std::shared_ptr<ConvNet> model;
  std::unique_ptr<testing::TrainerRig> rig;
  Trainer* trainer_ptr() { return rig->trainer.get(); }
};

TEST(MemoryStatsHook, WritesResidentMemoryEveryIntervalAndAtTheEnd) {
  SmallRun run;
  run.trainer_ptr()->register_hooks({std::make_shared<MemoryStatsHook>(/*interval=*/3)});
  run.trainer_ptr()->train(0, 7);
  const auto rss = run.trainer_ptr()->storage().history("memory/rss_mib").values();
  ASSERT_EQ(rss.size(), 3u);  // iterations 2, 5 and the last, 6
  EXPECT_EQ(rss[0].second, 2);
  EXPECT_EQ(rss[2].second, 6);
  const double peak = run.trainer_ptr()->storage().history("memory/peak_rss_mib").latest();
  EXPECT_GT(rss[2].first, 10.0);  // libtorch alone is tens of MiB
  EXPECT_GE(peak, rss[2].first);
}

TEST(SyncBuffersHook, AveragesFloatingBuffersAndBroadcastsTheRest) {
  SmallRun run;
  std::vector<std::string> calls;
  auto average = [&](torch::Tensor& t) {
    calls.push_back("average");
    t.fill_(0.5);
  };
  auto broadcast = [&](torch::Tensor& t) {
    calls.push_back("broadcast");
    t.fill_(7);
  };
  auto hook = std::make_shared<SyncBuffersHook>(/*mean=*/true, average, broadcast);
  run.trainer_ptr()->register_hooks({hook});
  run.trainer_ptr()->before_eval_epoch(false);
  int floating = 0, integral = 0;
  for (const auto& item : run.model->named_buffers()) {
    if (item.value().is_floating_point()) {
      ++floating;
      EXPECT_TRUE(torch::all(item.value() == 0.5).item<bool>()) << item.key();
    } else {
      ++integral;
      EXPECT_TRUE(torch::all(item.value() == 7).item<bool>()) << item.key();
    }
  }
  EXPECT_GT(floating, 0);
  EXPECT_GT(integral, 0);  // BatchNorm's num_batches_tracked
  EXPECT_EQ(calls.size(), static_cast<size_t>(floating + integral));
  // broadcast mode sends everything from rank 0; one process does nothing.
  auto broadcasting = std::make_shared<SyncBuffersHook>(/*mean=*/false, average, broadcast);
  calls.clear();
  SmallRun second;
  second.trainer_ptr()->register_hooks({broadcasting, std::make_shared<SyncBuffersHook>(true, nullptr, nullptr)});
  second.trainer_ptr()->before_eval_epoch(true);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "broadcast"), static_cast<long>(floating + integral));
}

TEST(EmptyCacheHook, RunsAtTheChosenPoints) {
  SmallRun run;
  auto defaults = std::make_shared<EmptyCacheHook>(false, true, false);
  auto every_iteration = std::make_shared<EmptyCacheHook>(true, false, true);
  run.trainer_ptr()->register_hooks({defaults, every_iteration});
  run.trainer_ptr()->train(0, 8);  // 2 epochs of 4 iterations
  run.trainer_ptr()->after_eval_epoch(false, {});
  EXPECT_EQ(defaults->calls(), 3);         // after each epoch and the evaluation
  EXPECT_EQ(every_iteration->calls(), 10);  // before each epoch and after each iteration
}

}  // namespace
}  // namespace lockstep
