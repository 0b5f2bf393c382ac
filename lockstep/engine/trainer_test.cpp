#include "lockstep/engine/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/data/data_loader.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/sampler.h"
#include "lockstep/model/model.h"
#include "tests/support/internal_error_check.h"
#include "tests/support/test_support.h"

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

// The run's phases move through move_phase: an iteration outside a run has
// no edge, and the assertion names the machine and both phases.
TEST(TrainerPhases, AnIterationOutsideARunIsAnInternalErrorNamingBothPhases) {
  struct Exposed : Trainer {
    using Trainer::run_iteration;
    using Trainer::Trainer;
  };
  auto model = std::make_shared<LinearModel>();
  Exposed trainer(model, make_loader(), make_wrapper(*model));
  testing::expect_internal_error([&] { trainer.run_iteration([] {}); },
                                 "the trainer has no move from idle to in a step");
  // A proper run moves through every phase and ends idle.
  trainer.begin(0, 2);
  trainer.run_iteration([] {});
  EXPECT_TRUE(trainer.running());
  trainer.end();
  EXPECT_FALSE(trainer.running());
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

struct ThrowingAfterTrain : Hook {
  explicit ThrowingAfterTrain(std::string message) : Hook("ThrowingAfterTrain", kHigh), message_(std::move(message)) {}
  void after_train() override { throw Error(message_); }
  std::string message_;
};

// detectron2 runs after_train in a `finally`: one hook failing there must not
// keep the hooks after it (the final evaluation, the writers' last write)
// from running. The first error still surfaces.
TEST(TrainerTest, EveryAfterTrainRunsWhenOneThrowsAndTheFirstErrorSurfaces) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  std::vector<std::string> log;
  trainer.register_hooks({std::make_shared<ThrowingAfterTrain>("first failure"),
                          std::make_shared<ThrowingAfterTrain>("second failure"),
                          std::make_shared<RecordingHook>("writer", &log)});
  try {
    trainer.train(0, 2);
    FAIL() << "the after_train error was swallowed";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "first failure");
  }
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "writer.after_train@2");
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

namespace lockstep {
namespace {

// Records every mmengine hook point it sees, with the iteration.
struct EveryPointHook : Hook {
  EveryPointHook(std::string name, int priority, std::vector<std::string>* log)
      : Hook(std::move(name), priority), log_(log) {}
  void note(const std::string& point) { log_->push_back(name() + "." + point + "@" + std::to_string(trainer().iter())); }
  void before_train() override { note("before_train"); }
  void after_train() override { note("after_train"); }
  void before_train_epoch() override { note("before_train_epoch"); }
  void after_train_epoch() override { note("after_train_epoch"); }
  void before_val_epoch() override { note("before_val_epoch"); }
  void after_val_epoch(const std::map<std::string, double>& metrics) override {
    note("after_val_epoch:" + std::to_string(metrics.size()));
  }
  void before_val_iter(int64_t index, const Batch&) override { note("before_val_iter" + std::to_string(index)); }
  void after_val_iter(int64_t index, const Batch&, const Batch&) override { note("after_val_iter" + std::to_string(index)); }
  void before_test_epoch() override { note("before_test_epoch"); }
  void after_test_epoch(const std::map<std::string, double>&) override { note("after_test_epoch"); }
  void before_test_iter(int64_t index, const Batch&) override { note("before_test_iter" + std::to_string(index)); }
  void after_test_iter(int64_t index, const Batch&, const Batch&) override { note("after_test_iter" + std::to_string(index)); }
  void before_save_checkpoint(State& checkpoint) override {
    note("before_save_checkpoint");
    checkpoint.values["added_by_" + name()] = 7;
  }
  void after_load_checkpoint(const State& checkpoint) override {
    note("after_load_checkpoint:" + std::to_string(checkpoint.values.value("added_by_" + name(), 0)));
  }
  std::vector<std::string>* log_;
};

std::vector<std::string> names_in_order(Trainer& trainer) {
  std::vector<std::string> names;
  for (const auto& hook : trainer.hooks()) names.push_back(hook->name());
  return names;
}

TEST(HookPriority, LowerNumbersRunFirstAndEqualPrioritiesKeepRegistrationOrder) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  std::vector<std::string> log;
  trainer.register_hooks({std::make_shared<EveryPointHook>("normal1", kNormal, &log),
                          std::make_shared<EveryPointHook>("lowest", kLowest, &log),
                          std::make_shared<EveryPointHook>("very_high", kVeryHigh, &log)});
  trainer.register_hooks({std::make_shared<EveryPointHook>("normal2", kNormal, &log),
                          std::make_shared<EveryPointHook>("p45", 45, &log),
                          std::make_shared<EveryPointHook>("highest", kHighest, &log)});
  EXPECT_EQ(names_in_order(trainer),
            (std::vector<std::string>{"highest", "very_high", "p45", "normal1", "normal2", "lowest"}));
  // Every stage runs them in that order.
  trainer.train(0, 1);
  std::vector<std::string> before_train;
  for (const auto& entry : log) {
    if (entry.find(".before_train@") != std::string::npos) before_train.push_back(entry.substr(0, entry.find('.')));
  }
  EXPECT_EQ(before_train, names_in_order(trainer));
  EXPECT_EQ(parse_hook_priority("VERY_HIGH"), 10);
  EXPECT_EQ(parse_hook_priority("45"), 45);
  EXPECT_EQ(hook_priority_name(90), "VERY_LOW");
  EXPECT_THROW(parse_hook_priority("URGENT"), Error);
}

TEST(HookPoints, EpochPointsBracketEachEpochAndCheckpointPointsSeeTheState) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model));  // 4 iterations per epoch
  std::vector<std::string> log;
  trainer.register_hooks({std::make_shared<EveryPointHook>("h", kNormal, &log)});
  trainer.train(2, 9);  // resumed mid-epoch 0, through epoch 1, into epoch 2
  std::vector<std::string> epochs;
  for (const auto& entry : log) {
    if (entry.find("epoch") != std::string::npos) epochs.push_back(entry);
  }
  EXPECT_EQ(epochs, (std::vector<std::string>{"h.after_train_epoch@3", "h.before_train_epoch@4",
                                              "h.after_train_epoch@7", "h.before_train_epoch@8"}));
  log.clear();
  State state = trainer.state();
  EXPECT_EQ(state.values.value("added_by_h", 0), 7);
  trainer.load_state(state);
  EXPECT_EQ(log, (std::vector<std::string>{"h.before_save_checkpoint@9", "h.after_load_checkpoint:7@9"}));
  // Evaluation passes reach the val_* or test_* points.
  log.clear();
  Batch batch{{"x", torch::zeros({1, 4})}};
  trainer.hooks().before_eval_epoch(false);
  trainer.hooks().before_eval_iter(false, 0, batch);
  trainer.hooks().after_eval_iter(false, 0, batch, batch);
  trainer.hooks().after_eval_epoch(false, {{"acc", 1.0}});
  trainer.hooks().before_eval_epoch(true);
  trainer.hooks().after_eval_epoch(true, {});
  EXPECT_EQ(log, (std::vector<std::string>{"h.before_val_epoch@9", "h.before_val_iter0@9", "h.after_val_iter0@9",
                                           "h.after_val_epoch:1@9", "h.before_test_epoch@9", "h.after_test_epoch@9"}));
}

// Stops from after_step at iteration 5: the run ends there like a finished one.
struct StopAt : Hook {
  explicit StopAt(int64_t iteration) : Hook("StopAt"), iteration_(iteration) {}
  void after_step() override {
    if (trainer().iter() == iteration_) trainer().stop().request("test");
  }
  void after_train() override { seen_at_end = trainer().iter(); }
  int64_t iteration_;
  int64_t seen_at_end = -1;
};

TEST(HookPoints, RequestStopEndsTheRunAfterTheCurrentIteration) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  auto stop = std::make_shared<StopAt>(5);
  trainer.register_hooks({stop});
  trainer.train(0, 20);
  EXPECT_TRUE(trainer.stop().stopped_early());
  EXPECT_EQ(trainer.iter(), 6);
  EXPECT_EQ(trainer.max_iter(), 6);
  EXPECT_EQ(stop->seen_at_end, 6);
}

struct StopsAlone : Hook {
  StopsAlone() : Hook("StopsAlone") {}
  void after_step() override {
    if (trainer().iter() == 2) trainer().stop().request("this rank alone");
  }
};

// Asks the trainer to stop (or, with `preemption`, to stop for a preemption)
// after iteration `at`; it declares that it may.
struct StopsAt : Hook {
  StopsAt(int64_t at, bool preemption) : Hook("StopsAt"), at_(at), preemption_(preemption) {}
  bool may_request_stop() const override { return true; }
  void after_step() override {
    if (trainer().iter() != at_) return;
    if (preemption_) {
      trainer().stop().request_preemption("SIGTERM received");
    } else {
      trainer().stop().request("declared");
    }
  }
  int64_t at_;
  bool preemption_;
};

// In a distributed run a stop must be every rank's: a hook that stops
// without declaring it is refused instead of leaving the other ranks to train
// on alone, and a declared stop on any rank stops this one at the same
// iteration (the agreement stands in for the other ranks).
TEST(HookPoints, StopsAreAgreedAcrossRanks) {
  {
    auto model = std::make_shared<LinearModel>();
    Trainer trainer(model, make_loader(), make_wrapper(*model));
    trainer.stop().set_agreement([](bool local) { return local; });
    trainer.register_hooks({std::make_shared<StopsAlone>()});
    EXPECT_NE(testing::error_of([&] { trainer.train(0, 10); }).find("no registered hook declares may_request_stop()"),
              std::string::npos);
  }
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  std::vector<bool> asked;
  // "Another rank" asks after iteration 3; this one never does.
  trainer.stop().set_agreement([&](bool local) {
    asked.push_back(local);
    return local || asked.size() == 5;  // votes: after before_train, then after iterations 0, 1, 2, 3
  });
  trainer.register_hooks({std::make_shared<StopsAt>(/*at=*/100, /*preemption=*/false)});
  trainer.train(0, 10);
  EXPECT_TRUE(trainer.stop().stopped_early());
  EXPECT_EQ(trainer.iter(), 4);
  // The stopping iteration votes once more: was it a preemption? (no)
  ASSERT_EQ(asked.size(), 6u);
  EXPECT_FALSE(asked[5]);
  EXPECT_FALSE(trainer.stop().preempted());
}

// A preemption is a vote: this rank, told after iteration 2, trains on until
// the ranks agree (here after iteration 3, when "the other rank" votes too),
// and then every rank knows the stop was a preemption.
TEST(HookPoints, APreemptionIsAVoteAndEveryRankLearnsIt) {
  auto model = std::make_shared<LinearModel>();
  Trainer trainer(model, make_loader(), make_wrapper(*model));
  std::vector<bool> asked;
  int votes_after_iteration_3 = 0;
  trainer.stop().set_agreement([&](bool local) {
    asked.push_back(local);
    // votes: before_train, iterations 0, 1, 2 (this rank's preemption, the
    // other rank outvotes it), then iteration 3: stop, and preemption.
    if (asked.size() == 4) return false;
    if (asked.size() >= 5) ++votes_after_iteration_3;
    return local || asked.size() >= 5;
  });
  trainer.register_hooks({std::make_shared<StopsAt>(/*at=*/2, /*preemption=*/true)});
  trainer.train(0, 10);
  EXPECT_EQ(trainer.iter(), 4);
  EXPECT_TRUE(trainer.stop().preempted());
  EXPECT_EQ(votes_after_iteration_3, 2);

  // On the last iteration a preemption changes nothing: the run finishes.
  Trainer last(model, make_loader(), make_wrapper(*model));
  last.register_hooks({std::make_shared<StopsAt>(/*at=*/9, /*preemption=*/true)});
  last.train(0, 10);
  EXPECT_EQ(last.iter(), 10);
  EXPECT_FALSE(last.stop().preempted());
  // One process: the stop is at once.
  Trainer alone(model, make_loader(), make_wrapper(*model));
  alone.register_hooks({std::make_shared<StopsAt>(/*at=*/2, /*preemption=*/true)});
  alone.train(0, 10);
  EXPECT_EQ(alone.iter(), 3);
  EXPECT_TRUE(alone.stop().preempted());
}

}  // namespace
}  // namespace lockstep
