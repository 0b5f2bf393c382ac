// MemoryStatsHook, SyncBuffersHook, EmptyCacheHook and ProgressBarHook inside a real Trainer.
#include <gtest/gtest.h>
#include <unistd.h>
#include <torch/torch.h>

#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/empty_cache_hook.h"
#include "lockstep/hooks/hooks_test_util.h"
#include "lockstep/hooks/memory_stats_hook.h"
#include "lockstep/hooks/progress_bar_hook.h"
#include "lockstep/hooks/sync_buffers_hook.h"
#include "lockstep/builtin_models/classifiers.h"

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
  run.trainer_ptr()->hooks().before_eval_epoch(false);
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
  second.trainer_ptr()->hooks().before_eval_epoch(true);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "broadcast"), static_cast<long>(floating + integral));
}

TEST(EmptyCacheHook, RunsAtTheChosenPoints) {
  SmallRun run;
  auto defaults = std::make_shared<EmptyCacheHook>(false, true, false);
  auto every_iteration = std::make_shared<EmptyCacheHook>(true, false, true);
  run.trainer_ptr()->register_hooks({defaults, every_iteration});
  run.trainer_ptr()->train(0, 8);  // 2 epochs of 4 iterations
  run.trainer_ptr()->hooks().after_eval_epoch(false, {});
  EXPECT_EQ(defaults->calls(), 3);         // after each epoch and the evaluation
  EXPECT_EQ(every_iteration->calls(), 10);  // before each epoch and after each iteration
}

// The bar's line after each step of a 2-epoch run (16 examples, batches of 4:
// 4 iterations per epoch), drawn into a pipe as if it were a terminal.
TEST(ProgressBarHook, DrawsEpochIterationEtaLossAndLrAndClearsAtTheEnd) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  StatusLine line(fds[1], StatusLine::Mode::kTerminal, /*width=*/200);
  testing::TrainerRig rig(std::make_shared<MLP>(MLPOptions().in_features(16)), 16, 4);
  auto bar = std::make_shared<ProgressBarHook>(line, /*refresh_seconds=*/1e-9);
  struct RecordsLr : Hook {  // the trainer records "loss" itself
    RecordsLr() : Hook("RecordsLr") {}
    void after_step() override { trainer().storage().put_scalar("lr", 0.01, /*smoothing_hint=*/false); }
  };
  rig.trainer->register_hooks({std::make_shared<RecordsLr>(), bar});
  rig.trainer->train(0, 8);
  ::close(fds[1]);
  std::string drawn;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) drawn.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  EXPECT_NE(drawn.find("train epoch 1/2 1/8 [#---------] "), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("train epoch 2/2 5/8 [######----] "), std::string::npos) << drawn;
  const size_t last = drawn.find("8/8 [##########] 100% eta 0:00:00 loss ");
  ASSERT_NE(last, std::string::npos) << drawn;
  EXPECT_NE(drawn.find(" lr 0.01", last), std::string::npos) << drawn;
  EXPECT_EQ(drawn.substr(drawn.size() - 4), "\r\033[K") << "the bar is erased when the run ends";
}

TEST(ProgressBarHook, DrawsNothingWhereTheLineIsOffOrOnAnotherRank) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  StatusLine terminal(fds[1], StatusLine::Mode::kTerminal, 200);
  StatusLine off(fds[1], StatusLine::Mode::kOff);
  testing::TrainerRig rig(std::make_shared<MLP>(MLPOptions().in_features(16)), 16, 4);
  rig.trainer->register_hooks({std::make_shared<ProgressBarHook>(off, 1e-9),
                               std::make_shared<ProgressBarHook>(terminal, 1e-9, /*active=*/false)});
  rig.trainer->train(0, 4);
  ::close(fds[1]);
  char buffer[16];
  EXPECT_EQ(::read(fds[0], buffer, sizeof buffer), 0);
  ::close(fds[0]);
}

TEST(ProgressBarHook, EvaluationLinesAndBars) {
  EXPECT_EQ(ProgressBarHook::bar(0.5, 4), "[##--]");
  EXPECT_EQ(ProgressBarHook::bar(1.5, 2), "[##]");
  EXPECT_EQ(ProgressBarHook::eval_text("val", 120, -1), "val batch 120");
  EXPECT_EQ(ProgressBarHook::eval_text("test", 1, 4), "test batch 1/4 [##--------]");
}

}  // namespace
}  // namespace lockstep
