// EMAHook: the average after k steps against the formula applied by hand to
// the recorded weights (interval, begin_iter, the first update's copy);
// evaluation swaps it in and back; its state round-trips.
#include "lockstep/hooks/ema_hook.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hooks_test_util.h"

namespace lockstep {
namespace {

// Snapshots the weights after each step, before the EMA hook sees them.
struct Snapshots : Hook {
  Snapshots() : Hook("Snapshots", kHigh) {}
  void after_step() override {
    std::map<std::string, torch::Tensor> weights;
    for (const auto& item : trainer().model().named_parameters()) weights[item.key()] = item.value().detach().clone();
    taken.push_back(weights);
  }
  std::vector<std::map<std::string, torch::Tensor>> taken;
};

struct EmaRig {
  explicit EmaRig(EMAOptions options) {
    ema = std::make_shared<EMAHook>(options);
    snapshots = std::make_shared<Snapshots>();
    trainer->register_hooks({ema, snapshots});
  }
  testing::TrainerRig rig{testing::tiny_mlp(4, 4), /*examples=*/32, /*side=*/4, /*lr=*/0.5};
  std::unique_ptr<Trainer>& trainer = rig.trainer;
  std::shared_ptr<EMAHook> ema;
  std::shared_ptr<Snapshots> snapshots;
};

TEST(EMAHook, AverageAfterKStepsFollowsTheFormula) {
  const double momentum = 0.2;
  EmaRig rig(EMAOptions().momentum(momentum).interval(2).begin_iter(3));
  rig.trainer->train(0, 9);
  ASSERT_EQ(rig.snapshots->taken.size(), 9u);
  double lag = 0;
  // By hand: iterations 0 and 1 copy (1 + 1 < 3, 2 + 1 >= 3 starts at i = 2);
  // then update k = 0 copies, k = 2, 4, 6 move by momentum, odd k keep.
  for (const auto& [name, unused] : rig.snapshots->taken[0]) {
    torch::Tensor expected;
    int64_t k = 0;
    for (int i = 0; i < 9; ++i) {
      const torch::Tensor weight = rig.snapshots->taken[i].at(name).to(torch::kDouble);
      if (i + 1 < 3 || k == 0) {
        expected = weight.clone();
        if (i + 1 >= 3) ++k;
        continue;
      }
      if (k % 2 == 0) expected = expected + momentum * (weight - expected);
      ++k;
    }
    EXPECT_EQ(rig.ema->steps(), 7);
    const torch::Tensor average = rig.ema->average().at("param/" + name).to(torch::kDouble);
    EXPECT_TRUE(torch::allclose(average, expected, 1e-6, 1e-7)) << name << "\n" << (average - expected).abs().max();
    // The weights moved, and the average lags behind them.
    EXPECT_GT((rig.snapshots->taken.back().at(name) - rig.snapshots->taken.front().at(name)).abs().max().item<double>(), 1e-3) << name;
    lag = std::max(lag, (average - rig.snapshots->taken.back().at(name).to(torch::kDouble)).abs().max().item<double>());
  }
  EXPECT_GT(lag, 1e-4) << "the average should lag behind the weights";
}

TEST(EMAHook, EvaluationSeesTheAverageAndTrainingGetsItsWeightsBack) {
  EmaRig rig(EMAOptions().momentum(0.3));
  rig.trainer->train(0, 5);
  std::map<std::string, torch::Tensor> weights;
  for (const auto& item : rig.trainer->model().named_parameters()) weights[item.key()] = item.value().detach().clone();
  std::map<std::string, torch::Tensor> average;
  for (const auto& [name, tensor] : rig.ema->average()) average[name] = tensor.clone();
  rig.trainer->hooks().before_eval_epoch(/*test=*/false);
  for (const auto& item : rig.trainer->model().named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), average.at("param/" + item.key()))) << item.key();
  }
  rig.trainer->hooks().after_eval_epoch(false, {});
  for (const auto& item : rig.trainer->model().named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), weights.at(item.key()))) << item.key();
  }
  rig.trainer->hooks().before_eval_epoch(/*test=*/true);
  EXPECT_THROW(rig.trainer->state(), Error);  // no checkpoint of swapped weights
  rig.trainer->hooks().after_eval_epoch(true, {});
}

TEST(EMAHook, StateRoundTripsBitwise) {
  EmaRig first(EMAOptions().momentum(0.1).update_buffers(true));
  first.trainer->train(0, 6);
  const State saved = first.ema->state();
  EmaRig second(EMAOptions().momentum(0.1).update_buffers(true));
  second.trainer->train(0, 1);
  second.ema->load_state(saved);
  EXPECT_EQ(second.ema->steps(), first.ema->steps());
  for (const auto& [name, tensor] : first.ema->average()) {
    EXPECT_TRUE(torch::equal(tensor, second.ema->average().at(name))) << name;
  }
}

}  // namespace
}  // namespace lockstep
