#include "lockstep/optim/optim_wrapper.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/optim/internal/optim_step_phase.h"
#include "lockstep/optim/optim_wrapper_builder.h"
#include "lockstep/model/model.h"
#include "tests/support/internal_error_check.h"
#include "tests/support/log_capture.h"
#include "tests/support/logits_classifier.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

struct TinyNet : testing::LogitsClassifier {
  TinyNet() {
    torch::manual_seed(0);
    fc1 = register_module("fc1", torch::nn::Linear(6, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 3));
  }
  torch::Tensor logits(const torch::Tensor& x) override { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

Batch make_data(int64_t n) {
  torch::manual_seed(1);
  return Batch{{"x", torch::randn({n, 6})}, {"y", torch::randint(0, 3, {n}, torch::kLong)}};
}

// An SGD wrapper of `net` (lr 1: an update is minus the clipped gradient) that
// clips as `kind` says, at `limit`: the max_norm, or for kValue the clip_value.
std::unique_ptr<OptimWrapper> clipping_sgd(TinyNet& net, ClipGradOptions::Kind kind, double limit) {
  ClipGradOptions clip;
  clip.kind = kind;
  (kind == ClipGradOptions::Kind::kValue ? clip.clip_value : clip.max_norm) = limit;
  return std::make_unique<OptimWrapper>(
      std::make_shared<torch::optim::SGD>(net.parameters(), torch::optim::SGDOptions(1.0)),
      OptimWrapperOptions().clip_grad(clip));
}

// One step of a TinyNet on `data` by clipping_sgd(kind, limit), and an
// untouched TinyNet of the same weights for the test to step by hand.
struct ClippedStep {
  std::shared_ptr<TinyNet> net = std::make_shared<TinyNet>();
  std::shared_ptr<TinyNet> reference = std::make_shared<TinyNet>();
  std::unique_ptr<OptimWrapper> wrapper;
};
ClippedStep clipped_step(const Batch& data, ClipGradOptions::Kind kind, double limit) {
  ClippedStep step;
  step.wrapper = clipping_sgd(*step.net, kind, limit);
  step.wrapper->initialize_count_status(0, 1);
  step.net->train_step(data, *step.wrapper);
  return step;
}

// `net` trained by a clipping wrapper has the parameters of `reference`,
// clipped and stepped by hand.
void expect_same_parameters(TinyNet& net, TinyNet& reference) {
  auto a = net.parameters();
  auto b = reference.parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << i;
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& module) {
  std::vector<torch::Tensor> grads;
  for (auto& p : module.parameters()) grads.push_back(p.grad().clone());
  return grads;
}

TEST(OptimWrapperTest, FourMicroBatchesOf16EqualOneBatchOf64) {
  Batch data = make_data(64);
  auto reference_net = std::make_shared<TinyNet>();
  auto accumulated_net = std::make_shared<TinyNet>();

  OptimWrapper reference(std::make_shared<torch::optim::SGD>(reference_net->parameters(), torch::optim::SGDOptions(0.1)));
  std::vector<torch::Tensor> reference_grads;
  reference.initialize_count_status(0, 1);
  reference_net->run_train_step(data, reference, {-1, [&] { reference_grads = grads_of(*reference_net); }});

  OptimWrapper accumulating(std::make_shared<torch::optim::SGD>(accumulated_net->parameters(), torch::optim::SGDOptions(0.1)),
                            OptimWrapperOptions().accumulative_counts(4));
  std::vector<torch::Tensor> accumulated_grads;
  accumulating.initialize_count_status(0, 4);
  const StepContext keep_grads{-1, [&] { accumulated_grads = grads_of(*accumulated_net); }};
  for (int64_t i = 0; i < 4; ++i) {
    accumulated_net->run_train_step(data.slice(i * 16, 16), accumulating, keep_grads);
  }
  ASSERT_EQ(reference_grads.size(), accumulated_grads.size());
  for (size_t i = 0; i < reference_grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(reference_grads[i], accumulated_grads[i], 1e-5, 1e-6)) << "grad " << i;
  }
  auto a = reference_net->parameters();
  auto b = accumulated_net->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << "param " << i;
}

TEST(OptimWrapperTest, LastShorterWindowIsScaledByItsRealLength) {
  auto net = std::make_shared<TinyNet>();
  OptimWrapper wrapper(std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1)),
                       OptimWrapperOptions().accumulative_counts(4));
  wrapper.initialize_count_status(0, 6);  // windows: [0, 4) and the short [4, 6)
  std::vector<double> factors;
  std::vector<bool> updates, syncs;
  Batch data = make_data(8);
  for (int i = 0; i < 6; ++i) {
    factors.push_back(1.0 / wrapper.scale_loss(torch::ones({})).item<double>());
    syncs.push_back(wrapper.accumulation().should_sync());
    net->train_step(data, wrapper);
    updates.push_back(wrapper.accumulation().should_update());
  }
  EXPECT_EQ(factors, (std::vector<double>{4, 4, 4, 4, 2, 2}));
  EXPECT_EQ(syncs, (std::vector<bool>{false, false, false, true, false, true}));
  EXPECT_EQ(updates, (std::vector<bool>{false, false, false, true, false, true}));
}

// A checkpoint saved inside an accumulation window cannot resume exactly (the
// window's first gradients are not saved): say so instead of diverging quietly.
TEST(OptimWrapperTest, StartingInsideAnAccumulationWindowWarnsWhatIsLost) {
  auto net = std::make_shared<TinyNet>();
  OptimWrapper wrapper(std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1)),
                       OptimWrapperOptions().accumulative_counts(4));
  {
    testing::LogCapture log;
    wrapper.initialize_count_status(8, 20);
    EXPECT_EQ(log.text(), "") << "a window boundary loses nothing";
  }
  testing::LogCapture log;
  wrapper.initialize_count_status(10, 20);
  EXPECT_NE(log.text().find("warning Starting at iteration 10, inside an accumulation window of 4 micro-steps "
                            "(iterations 8-11): the gradients of its first 2 micro-step(s) were not saved"),
            std::string::npos)
      << log.text();
}

TEST(OptimWrapperTest, ClipByNormMatchesLibtorchAndLogsTheNorm) {
  Batch data = make_data(32);
  auto step = clipped_step(data, ClipGradOptions::Kind::kNorm, 0.05);

  auto parsed = parse_losses(step.reference->loss(data));
  parsed.loss.backward();
  double norm = torch::nn::utils::clip_grad_norm_(step.reference->parameters(), 0.05);
  torch::optim::SGD sgd(step.reference->parameters(), torch::optim::SGDOptions(1.0));
  sgd.step();
  EXPECT_NEAR(step.wrapper->last_update_metrics().at("grad_norm"), norm, 1e-6 * norm);
  EXPECT_GT(norm, 0.05) << "the test must actually clip";
  expect_same_parameters(*step.net, *step.reference);
}

TEST(OptimWrapperTest, ClipPerParameterClipsEachGradientAgainstItsOwnNorm) {
  // detectron2's CLIP_TYPE "norm": clip_grad_norm_(p) for each parameter.
  Batch data = make_data(32);
  auto step = clipped_step(data, ClipGradOptions::Kind::kNormPerParameter, 0.02);

  parse_losses(step.reference->loss(data)).loss.backward();
  int clipped = 0, kept = 0;
  for (auto& p : step.reference->parameters()) {
    const double norm = torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{p}, 0.02);
    (norm > 0.02 ? clipped : kept) += 1;
  }
  torch::optim::SGD(step.reference->parameters(), torch::optim::SGDOptions(1.0)).step();
  EXPECT_GT(clipped, 0) << "the test must clip some gradients";
  EXPECT_EQ(step.wrapper->last_update_metrics().count("grad_norm"), 0u) << "there is no one norm to log";
  // libtorch's C++ clip_grad_norm_ divides where Python's (and lockstep's)
  // multiplies by a reciprocal: the differential suite holds the bits.
  expect_same_parameters(*step.net, *step.reference);
}

struct ShardedSync : GradientSync {
  void begin_forward(bool) override {}
  void begin_backward(const torch::Tensor&, bool, int64_t) override {}
  void end_backward(bool) override {}
  bool holds_whole_gradients() const override { return false; }
};

TEST(OptimWrapperTest, ClipPerParameterRefusesShardedGradients) {
  auto net = std::make_shared<TinyNet>();
  auto wrapper = clipping_sgd(*net, ClipGradOptions::Kind::kNormPerParameter, 1.0);
  EXPECT_THAT([&] { wrapper->set_gradient_sync(std::make_shared<ShardedSync>()); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("norm_per_parameter")));
}

TEST(OptimWrapperTest, ClipByValueClampsEveryGradient) {
  auto net = std::make_shared<TinyNet>();
  auto wrapper = clipping_sgd(*net, ClipGradOptions::Kind::kValue, 1e-3);
  std::vector<torch::Tensor> before;
  for (auto& p : net->parameters()) before.push_back(p.detach().clone());
  wrapper->initialize_count_status(0, 1);
  net->train_step(make_data(16), *wrapper);
  auto after = net->parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    // With lr 1 the update is minus the clipped gradient.
    // float32 parameters: the difference carries rounding of one ulp of the value.
    EXPECT_LE((after[i] - before[i]).abs().max().item<double>(), 1e-3 + 1e-6);
  }
}

struct RecordingSync : GradientSync {
  std::vector<std::string> calls;
  void begin_forward(bool sync) override { calls.push_back(sync ? "forward+sync" : "forward"); }
  void begin_backward(const torch::Tensor& loss, bool sync, int64_t /*iteration*/) override {
    EXPECT_TRUE(loss.requires_grad());
    calls.push_back(sync ? "backward+sync" : "backward");
  }
  void end_backward(bool sync) override { calls.push_back(sync ? "end+sync" : "end"); }
};

TEST(OptimWrapperTest, GradientSyncSeesNoSyncMicroStepsAndTheSyncedOne) {
  auto net = std::make_shared<TinyNet>();
  OptimWrapper wrapper(std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1)),
                       OptimWrapperOptions().accumulative_counts(2));
  auto sync = std::make_shared<RecordingSync>();
  wrapper.set_gradient_sync(sync);
  wrapper.initialize_count_status(0, 4);
  Batch data = make_data(4);
  for (int i = 0; i < 2; ++i) net->train_step(data, wrapper);
  EXPECT_EQ(sync->calls, (std::vector<std::string>{"forward", "backward", "end", "forward+sync", "backward+sync", "end+sync"}));
}

// Records what each step_failed was told; end_backward throws while `fail` is set.
struct FailureRecordingSync : RecordingSync {
  bool fail = false;
  std::vector<bool> reduced;  // one entry per step_failed
  void end_backward(bool sync) override {
    RecordingSync::end_backward(sync);
    if (fail) throw Error("a rank's backward failed");
  }
  void step_failed(const std::exception_ptr& /*error*/, bool was_reduced, bool /*sync*/,
                   int64_t /*iteration*/) override {
    reduced.push_back(was_reduced);
  }
};

// A failed step is reported to the GradientSync once, saying whether its
// gradients were already summed across ranks (DDP then marks the ranks
// diverged instead of completing the pass with zeros). Without a trainer's
// step, each backward is a step of its own, so an earlier update's reduction
// is not taken for this one's.
TEST(OptimWrapperTest, AFailedStepIsReportedOnceSayingWhetherItsGradientsWereReduced) {
  using Phase = OptimWrapper::StepPhase;
  auto net = std::make_shared<TinyNet>();
  OptimWrapper wrapper(std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1)));
  auto sync = std::make_shared<FailureRecordingSync>();
  wrapper.set_gradient_sync(sync);
  const Batch data = make_data(4);
  const auto error = std::make_exception_ptr(Error("the optimizer step failed"));
  StepContext context;
  {
    auto scope = wrapper.begin_step(context);
    EXPECT_EQ(wrapper.step_phase(), Phase::kRunning);
    net->train_step(data, wrapper);
    EXPECT_EQ(wrapper.step_phase(), Phase::kReduced);
    wrapper.abandon_step(error);
    wrapper.abandon_step(error);  // told once
    EXPECT_EQ(wrapper.step_phase(), Phase::kFailed);
  }
  EXPECT_EQ(sync->reduced, (std::vector<bool>{true}));
  {
    auto scope = wrapper.begin_step(context);  // a new step begins clean
    wrapper.abandon_step(error);
  }
  EXPECT_EQ(sync->reduced, (std::vector<bool>{true, false}));

  net->train_step(data, wrapper);  // no trainer: this backward's own step, reduced
  EXPECT_EQ(wrapper.step_phase(), Phase::kReduced);
  sync->fail = true;
  EXPECT_THROW(net->train_step(data, wrapper), Error);
  wrapper.abandon_step(error);  // a loop that owns its steps tells it again: told once
  EXPECT_EQ(sync->reduced, (std::vector<bool>{true, false, false}));

  // Going on with a step whose failure was reported is the user's mistake, said as such.
  sync->fail = false;
  auto scope = wrapper.begin_step(context);
  sync->fail = true;
  EXPECT_THROW(net->train_step(data, wrapper), Error);
  sync->fail = false;
  const std::string users = testing::error_of([&] { net->train_step(data, wrapper); });
  EXPECT_NE(users.find("whose failure was already reported"), std::string::npos) << users;
  EXPECT_EQ(users.find("internal error"), std::string::npos) << "the user's mistake reached the assertion";
}

// The machine behind those checks: a move it does not have is a lockstep bug,
// reported as one, naming both phases, and the phase stays where it was.
TEST(OptimWrapperPhases, AWrongMoveIsAnInternalErrorNamingBothPhases) {
  using Phase = OptimWrapper::StepPhase;
  Phase phase = Phase::kRunning;
  move_optim_step_phase(phase, Phase::kReduced);
  move_optim_step_phase(phase, Phase::kFailed);
  testing::expect_internal_error([&] { move_optim_step_phase(phase, Phase::kReduced); },
                                 "the optim wrapper's step has no move from failed to reduced");
  EXPECT_EQ(phase, Phase::kFailed);
  EXPECT_THROW(move_optim_step_phase(phase, Phase::kFailed), InternalError);  // reported once
  move_optim_step_phase(phase, Phase::kRunning);                              // a new step
  EXPECT_EQ(phase, Phase::kRunning);
}

TEST(OptimWrapperTest, ZeroGradDropsGradients) {
  auto net = std::make_shared<TinyNet>();
  OptimWrapper wrapper(std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1)));
  parse_losses(net->loss(make_data(4))).loss.backward();
  for (auto& p : net->parameters()) ASSERT_TRUE(p.grad().defined());
  wrapper.zero_grad();
  for (auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(OptimWrapperTest, ContextCannotBeNestedAndLossMustBeScalar) {
  auto net = std::make_shared<TinyNet>();
  OptimWrapper wrapper(std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1)));
  {
    auto context = wrapper.optim_context();
    EXPECT_THROW((void)wrapper.optim_context(), Error);
  }
  auto again = wrapper.optim_context();  // the first one closed
  EXPECT_THROW(wrapper.update_params(torch::ones({2}, torch::requires_grad())), Error);
  EXPECT_THROW(wrapper.update_params(torch::ones({})), Error);  // does not require grad
}

TEST(OptimWrapperTest, StateRoundTripContinuesIdentically) {
  Batch data = make_data(16);
  auto make = [](std::shared_ptr<TinyNet> net) {
    return std::make_shared<OptimWrapper>(std::make_shared<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)));
  };
  auto net_a = std::make_shared<TinyNet>();
  auto wrapper_a = make(net_a);
  wrapper_a->initialize_count_status(0, 6);
  for (int i = 0; i < 3; ++i) net_a->train_step(data, *wrapper_a);
  State saved = wrapper_a->state();

  auto net_b = std::make_shared<TinyNet>();
  {
    torch::NoGradGuard no_grad;
    auto pa = net_a->parameters();
    auto pb = net_b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  auto wrapper_b = make(net_b);
  wrapper_b->load_state(saved);
  wrapper_b->initialize_count_status(3, 6);
  for (int i = 0; i < 3; ++i) {
    net_a->train_step(data, *wrapper_a);
    net_b->train_step(data, *wrapper_b);
  }
  auto pa = net_a->parameters();
  auto pb = net_b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
}

TEST(OptimWrapperDictTest, HoldsNamedWrappersAndReportsEachLr) {
  auto g = std::make_shared<TinyNet>();
  auto d = std::make_shared<TinyNet>();
  OptimWrapperDict dict;
  dict.add("generator", std::make_shared<OptimWrapper>(std::make_shared<torch::optim::SGD>(g->parameters(), torch::optim::SGDOptions(0.2))));
  dict.add("discriminator", std::make_shared<OptimWrapper>(std::make_shared<torch::optim::SGD>(d->parameters(), torch::optim::SGDOptions(0.3))));
  EXPECT_EQ(dict.learning_rates(), (std::map<std::string, double>{{"discriminator", 0.3}, {"generator", 0.2}}));
  EXPECT_THROW(dict["critic"], Error);
  EXPECT_THROW(dict.add("generator", nullptr), Error);
  // A single-optimizer model asked to train with several optimizers says what to implement.
  try {
    g->run_train_step(make_data(2), dict);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("OptimWrapperDict&"), std::string::npos) << error.what();
  }
}

// Each sync's step_failed throws its own agreed error, as DDP's does.
struct AgreeingFailureSync : FailureRecordingSync {
  explicit AgreeingFailureSync(std::string agreed) : agreed(std::move(agreed)) {}
  std::string agreed;
  void step_failed(const std::exception_ptr& error, bool was_reduced, bool sync, int64_t iteration) override {
    FailureRecordingSync::step_failed(error, was_reduced, sync, iteration);
    throw Error(agreed);
  }
};

// A failed step of a model with several networks (a GAN under separate DDP)
// is reported to every network's sync, although the first one throws.
TEST(OptimWrapperDictTest, AnAbandonedStepTellsEveryWrapperAndThrowsTheFirstError) {
  OptimWrapperDict dict;
  std::vector<std::shared_ptr<AgreeingFailureSync>> syncs;
  for (const std::string name : {"discriminator", "generator"}) {
    auto net = std::make_shared<TinyNet>();
    auto wrapper = std::make_shared<OptimWrapper>(
        std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1)));
    syncs.push_back(std::make_shared<AgreeingFailureSync>(name + "'s agreed error"));
    wrapper->set_gradient_sync(syncs.back());
    dict.add(name, wrapper);
  }
  StepContext context;
  auto scope = dict.begin_step(context);
  const std::string message =
      testing::error_of([&] { dict.abandon_step(std::make_exception_ptr(Error("the generator's loss failed"))); });
  EXPECT_NE(message.find("discriminator's agreed error"), std::string::npos) << message;  // the first, by name
  for (const auto& sync : syncs) EXPECT_EQ(sync->reduced, (std::vector<bool>{false})) << sync->agreed;
}

// accumulative_counts and clip_grad are checked in one place
// (check_optim_wrapper_options): from a config the error names its line,
// from C++ the option.
TEST(OptimWrapperOptionsCheck, OneCheckNamesTheConfigLineOrTheOption) {
  torch::nn::Linear model(2, 1);
  auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  const std::string counts = testing::error_of([&] { wrap_optimizer(parse_config("accumulative_counts: 0\n", "w.yaml"), sgd); });
  EXPECT_NE(counts.find("w.yaml:1"), std::string::npos) << counts;
  EXPECT_NE(counts.find("accumulative_counts must be at least 1, got 0"), std::string::npos) << counts;
  const std::string clip =
      testing::error_of([&] { wrap_optimizer(parse_config("clip_grad:\n  max_norm: -1\n", "w.yaml"), sgd); });
  EXPECT_NE(clip.find("w.yaml:2"), std::string::npos) << clip;
  EXPECT_NE(clip.find("max_norm must be positive, got -1"), std::string::npos) << clip;
  const std::string direct = testing::error_of([&] { OptimWrapper(sgd, OptimWrapperOptions().accumulative_counts(0)); });
  EXPECT_NE(direct.find("OptimWrapperOptions accumulative_counts: accumulative_counts must be at least 1"),
            std::string::npos)
      << direct;
}

}  // namespace
}  // namespace lockstep
