// MemoryStatsHook, SyncBuffersHook and EmptyCacheHook inside a real Trainer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/data/data_loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/data/synthetic.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/empty_cache_hook.h"
#include "lockstep/hooks/memory_stats_hook.h"
#include "lockstep/hooks/sync_buffers_hook.h"
#include "lockstep/models/classifiers.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {
namespace {

struct SmallRun {
  SmallRun() {
    torch::manual_seed(0);
    model = std::make_shared<ConvNet>(ConvNetOptions().in_channels(1).image_size(8).channels({2, 4}).hidden(8).batch_norm(true));
    model->set_data_preprocessor(std::make_shared<ImgDataPreprocessor>(std::vector<double>{}, std::vector<double>{}));
    auto data = std::make_shared<SyntheticImages>(SyntheticImagesOptions().size(16).height(8).width(8));
    auto loader = std::make_shared<DataLoader>(data, std::make_shared<SequentialSampler>(16), DataLoaderOptions().batch_size(4));
    strategy = std::make_shared<SingleDeviceStrategy>();
    strategy->prepare(model, Config::parse("optimizer: {type: SGD, lr: 0.01}"), Config(), SchedulerContext{4, 100});
    trainer = std::make_unique<Trainer>(strategy->model(), loader, strategy->optim_wrapper());
  }
  std::shared_ptr<ConvNet> model;
  std::shared_ptr<SingleDeviceStrategy> strategy;
  std::unique_ptr<Trainer> trainer;
};

TEST(MemoryStatsHook, WritesResidentMemoryEveryIntervalAndAtTheEnd) {
  SmallRun run;
  run.trainer->register_hooks({std::make_shared<MemoryStatsHook>(/*interval=*/3)});
  run.trainer->train(0, 7);
  const auto rss = run.trainer->storage().history("memory/rss_mib").values();
  ASSERT_EQ(rss.size(), 3u);  // iterations 2, 5 and the last, 6
  EXPECT_EQ(rss[0].second, 2);
  EXPECT_EQ(rss[2].second, 6);
  const double peak = run.trainer->storage().history("memory/peak_rss_mib").latest();
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
  run.trainer->register_hooks({hook});
  run.trainer->before_eval_epoch(false);
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
  second.trainer->register_hooks({broadcasting, std::make_shared<SyncBuffersHook>(true, nullptr, nullptr)});
  second.trainer->before_eval_epoch(true);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "broadcast"), static_cast<long>(floating + integral));
}

TEST(EmptyCacheHook, RunsAtTheChosenPoints) {
  SmallRun run;
  auto defaults = std::make_shared<EmptyCacheHook>(false, true, false);
  auto every_iteration = std::make_shared<EmptyCacheHook>(true, false, true);
  run.trainer->register_hooks({defaults, every_iteration});
  run.trainer->train(0, 8);  // 2 epochs of 4 iterations
  run.trainer->after_eval_epoch(false, {});
  EXPECT_EQ(defaults->calls(), 3);         // after each epoch and the evaluation
  EXPECT_EQ(every_iteration->calls(), 10);  // before each epoch and after each iteration
}

}  // namespace
}  // namespace lockstep
