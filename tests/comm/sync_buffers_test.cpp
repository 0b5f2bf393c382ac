// SyncBuffersHook over Gloo: ranks whose BatchNorm statistics differ hold
// their mean (floating buffers) and rank 0's counters after it runs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/data/data_loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/data/synthetic.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/sync_buffers_hook.h"
#include "lockstep/builtin_models/classifiers.h"
#include "lockstep/strategy/strategy.h"
#include "tests/comm/dist_test_util.h"

namespace lockstep {
namespace {

LOCKSTEP_WORKER_TEST(SyncBuffersWorker, MeanAndBroadcastOverTheWorld) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  const int rank = world->rank(), size = world->size();
  torch::manual_seed(0);
  auto model = std::make_shared<ConvNet>(ConvNetOptions().image_size(8).channels({2, 4}).hidden(8));
  model->set_data_preprocessor(std::make_shared<ImgDataPreprocessor>(std::vector<double>{}, std::vector<double>{}));
  auto data = std::make_shared<SyntheticImages>(SyntheticImagesOptions().size(8).height(8).width(8));
  auto loader = std::make_shared<DataLoader>(data, std::make_shared<SequentialSampler>(8), DataLoaderOptions().batch_size(4));
  auto strategy = std::make_shared<SingleDeviceStrategy>();
  strategy->prepare(model, parse_config("optimizer: {type: SGD, lr: 0.01}"), Config(), SchedulerContext{2, 10});
  Trainer trainer(strategy->model(), loader, strategy->optim_wrapper());
  // Rank r's statistics: r + 1 everywhere; its counters: 10 + r.
  torch::NoGradGuard no_grad;
  for (const auto& item : model->named_buffers()) {
    if (item.value().is_floating_point()) {
      item.value().fill_(rank + 1);
    } else {
      item.value().fill_(10 + rank);
    }
  }
  auto average = [world](torch::Tensor& t) { world->all_reduce(t, ReduceOp::kAvg); };
  auto broadcast = [world](torch::Tensor& t) { world->broadcast(t, 0); };
  trainer.register_hooks({std::make_shared<SyncBuffersHook>(/*mean=*/true, average, broadcast)});
  trainer.hooks().before_eval_epoch(/*test=*/false);
  const double mean = (size + 1) / 2.0;  // of 1 .. size
  for (const auto& item : model->named_buffers()) {
    if (item.value().is_floating_point()) {
      EXPECT_TRUE(torch::allclose(item.value(), torch::full_like(item.value(), mean))) << item.key();
    } else {
      EXPECT_TRUE(torch::all(item.value() == 10).item<bool>()) << item.key();
    }
  }
}

TEST(SyncBuffers, TwoAndThreeRanks) {
  for (int ranks : {2, 3}) testing::expect_workers_pass(ranks, "SyncBuffersWorker.*");
}

}  // namespace
}  // namespace lockstep
