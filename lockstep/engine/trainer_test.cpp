#include "lockstep/engine/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/data/data_loader.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/sampler.h"
#include "lockstep/model/model.h"

namespace lockstep {
namespace {

struct LinearModel : Model {
  LinearModel() {
    torch::manual_seed(0);
    fc = register_module("fc", torch::nn::Linear(4, 1));
  }
  LossDict loss(const Batch& data) override {
    if (fail_at_call >= 0 && calls++ == fail_at_call) throw std::runtime_error("boom in forward");
    LossDict losses;
    torch::Tensor prediction = fc(data.at("x")).squeeze(1);
    torch::Tensor loss = torch::mse_loss(prediction, data.at("y"));
    if (nan_loss) loss = loss * std::numeric_limits<float>::quiet_NaN();
    losses.insert("loss", loss);
    return losses;
  }
  Batch predict(const Batch& data) override { return {{"y", fc(data.at("x"))}}; }
  torch::nn::Linear fc{nullptr};
  int fail_at_call = -1;
  int calls = 0;
  bool nan_loss = false;
};

std::shared_ptr<DataLoader> make_loader() {
  torch::manual_seed(2);
  auto dataset = std::make_shared<TensorDataset>(Batch{{"x", torch::randn({32, 4})}, {"y", torch::randn({32})}});
  auto sampler = std::make_shared<SequentialSampler>(32);
  return std::make_shared<DataLoader>(dataset, sampler, DataLoaderOptions().batch_size(8));
}

std::shared_ptr<OptimWrapper> make_wrapper(Model& model) {
  return std::make_shared<OptimWrapper>(
      std::make_shared<torch::optim::SGD>(model.parameters(), torch::optim::SGDOptions(0.01)));
}

struct RecordingHook : Hook {
  RecordingHook(std::string name, std::vector<std::string>* log) : Hook(std::move(name)), log_(log) {}
  void before_train() override { log_->push_back(name() + ".before_train@" + std::to_string(trainer().iter())); }
  void after_train() override { log_->push_back(name() + ".after_train@" + std::to_string(trainer().iter())); }
  void before_step() override { log_->push_back(name() + ".before_step@" + std::to_string(trainer().iter())); }
  void after_backward() override { log_->push_back(name() + ".after_backward@" + std::to_string(trainer().iter())); }
  void after_step() override {
    EXPECT_EQ(trainer().storage().iter(), trainer().iter());
    log_->push_back(name() + ".after_step@" + std::to_string(trainer().iter()));
  }
  std::vector<std::string>* log_;
};

TEST(TrainerTest, HooksRunInRegistrationOrderAtEveryStage) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  std::vector<std::string> log;
  trainer.register_hooks({std::make_shared<RecordingHook>("a", &log), nullptr, std::make_shared<RecordingHook>("b", &log)});
  EXPECT_EQ(trainer.hooks().size(), 2u);
  trainer.train(3, 5);
  EXPECT_EQ(trainer.iter(), 5);
  std::vector<std::string> expected{"a.before_train@3", "b.before_train@3"};
  for (int i = 3; i < 5; ++i) {
    for (const char* stage : {"before_step", "after_backward", "after_step"}) {
      expected.push_back(std::string("a.") + stage + "@" + std::to_string(i));
      expected.push_back(std::string("b.") + stage + "@" + std::to_string(i));
    }
  }
  expected.push_back("a.after_train@5");
  expected.push_back("b.after_train@5");
  EXPECT_EQ(log, expected);
}

TEST(TrainerTest, AfterTrainRunsWhenAStepThrowsAndTheErrorPropagates) {
  auto model = std::make_shared<LinearModel>();
  model->fail_at_call = 2;
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  std::vector<std::string> log;
  trainer.register_hooks({std::make_shared<RecordingHook>("h", &log)});
  EXPECT_THROW(trainer.train(0, 10), std::runtime_error);
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "h.after_train@2");  // iter() != max_iter tells hooks the run failed
  EXPECT_LT(trainer.iter(), trainer.max_iter());
}

TEST(TrainerTest, StepMetricsLandInTheStorage) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model), TrainerOptions().gather_metric_period(2));
  trainer.train(0, 6);
  auto loss = trainer.storage().history("loss");
  // Iterations 1, 3, 5 are gathered with a period of 2.
  ASSERT_EQ(loss.size(), 3u);
  EXPECT_EQ(loss.values()[0].second, 1);
  EXPECT_EQ(loss.values()[2].second, 5);
  EXPECT_TRUE(trainer.storage().has("data_time"));
  EXPECT_TRUE(trainer.storage().has("rank_data_time"));
}

TEST(TrainerTest, NonFiniteLossStopsWithTheLossDict) {
  auto model = std::make_shared<LinearModel>();
  model->nan_loss = true;
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  try {
    trainer.train(0, 3);
    FAIL();
  } catch (const Error& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("Loss became infinite or NaN at iteration=0"), std::string::npos) << message;
    EXPECT_NE(message.find("loss_dict = {"), std::string::npos) << message;
  }
}

TEST(TrainerTest, AsyncMetricsAreRecordedInOrderAndErrorsSurface) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model), TrainerOptions().async_write_metrics(true));
  trainer.train(0, 8);
  auto loss = trainer.storage().history("loss");
  ASSERT_EQ(loss.size(), 8u);  // drained by after_train
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(loss.values()[static_cast<size_t>(i)].second, i);

  auto bad = std::make_shared<LinearModel>();
  bad->nan_loss = true;
  Trainer failing(bad, make_loader(), make_wrapper(*bad), TrainerOptions().async_write_metrics(true));
  EXPECT_THROW(failing.train(0, 4), Error);
}

TEST(TrainerTest, ModelMustStayInTrainingMode) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  struct EvalSwitcher : Hook {
    EvalSwitcher() : Hook("EvalSwitcher") {}
    void before_step() override { trainer().model().eval(); }
  };
  trainer.register_hooks({std::make_shared<EvalSwitcher>()});
  try {
    trainer.train(0, 2);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("eval mode"), std::string::npos) << error.what();
  }
}

struct CountingHook : Hook {
  CountingHook() : Hook("Counting") {}
  void after_step() override { ++count; }
  bool stateful() const override { return true; }
  State state() const override {
    State state;
    state.values["count"] = count;
    return state;
  }
  void load_state(const State& state) override { count = state.values.at("count").get<int>(); }
  int count = 0;
};

TEST(TrainerTest, StateRestoresIterationHooksAndDataPosition) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  auto counting = std::make_shared<CountingHook>();
  trainer.register_hooks({counting});
  trainer.train(0, 3);
  State saved = trainer.state();
  Batch expected_next = trainer.data_loader().next();

  auto other_model = std::make_shared<LinearModel>();
  Trainer restored(other_model, make_loader(), make_wrapper(*other_model));
  auto other_counting = std::make_shared<CountingHook>();
  restored.register_hooks({other_counting});
  restored.load_state(saved);
  EXPECT_EQ(restored.iter(), 3);
  EXPECT_EQ(other_counting->count, 3);
  EXPECT_TRUE(torch::equal(restored.data_loader().next().at("x"), expected_next.at("x")));
}

TEST(TrainerTest, ZeroGradBeforeForwardDiscardsStaleGradients) {
  auto model = std::make_shared<LinearModel>();
  auto wrapper = make_wrapper(*model);
  Trainer trainer(model, make_loader(), wrapper, TrainerOptions().zero_grad_before_forward(true));
  // A stale gradient a hook left behind must not leak into the step.
  for (auto& p : model->parameters()) p.mutable_grad() = torch::full_like(p, 1e6);
  auto reference = std::make_shared<LinearModel>();
  Trainer clean(reference, make_loader(), make_wrapper(*reference));
  trainer.train(0, 1);
  clean.train(0, 1);
  auto a = model->parameters();
  auto b = reference->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i]));
}

}  // namespace
}  // namespace lockstep
