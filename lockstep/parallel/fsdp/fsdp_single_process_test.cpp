// FullyShardedDataParallel inside the test process, in a world of one. With
// param_dtype float64 the gathered parameters are a copy of the float32
// shards, so the whole gather / free cycle runs without other ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>

#include "lockstep/compat/internal/storage.h"
#include "lockstep/core/error.h"
#include "lockstep/comm/init.h"
#include "lockstep/model/model.h"
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"
#include "lockstep/strategy/strategy.h"
#include "tests/fsdp/fsdp_test_util.h"
#include "tests/support/logits_classifier.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

void ensure_world_of_one() {
  if (!is_initialized()) init_process_group(InitOptions());
}

Batch make_batch(int64_t size, uint64_t seed, torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(seed);
  return Batch{{"x", torch::randn({size, 6}).to(dtype)}, {"y", torch::randint(0, 4, {size}, torch::kLong)}};
}

FSDPOptions linear_units() {
  return FSDPOptions()
      .auto_wrap_policy(module_type_wrap_policy({"Linear"}))
      .mixed_precision(MixedPrecision().param_dtype(torch::kFloat64));
}

std::shared_ptr<OptimWrapper> adam_over(std::vector<torch::Tensor> params, OptimWrapperOptions options = {}) {
  return std::make_shared<OptimWrapper>(
      std::make_shared<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(1e-2)), options);
}

TEST(FsdpSingleProcess, StorageIsFreedAndReallocatedInPlace) {
  torch::Tensor full = torch::arange(8, torch::kFloat);
  torch::Tensor view = full.narrow(0, 2, 3);
  compat::free_storage(full);
  EXPECT_EQ(compat::storage_bytes(view), 0u);
  compat::allocate_storage(full);
  EXPECT_EQ(compat::storage_bytes(view), 8 * sizeof(float));
  EXPECT_TRUE(compat::same_storage(view, full));
  full.copy_(torch::arange(8, torch::kFloat) * 2);
  EXPECT_TRUE(torch::equal(view, torch::tensor({4.f, 6.f, 8.f})));
}

// The MLP of the multi-process tests, in float64 (so its Linears, the units, are Sequential entries).
Batch mlp_batch(int64_t size, uint64_t seed) {
  Batch batch = testing::global_batch("mlp", size, seed);
  return Batch{{"x", batch.at("x").to(torch::kFloat64)}, {"y", batch.at("y")}};
}

using MakeOptim = std::function<std::shared_ptr<OptimWrapper>(std::vector<torch::Tensor>)>;

// `model` (wrapped by `fsdp`, its optimizer over the shards) and `reference`
// (the same optimizer over its own parameters) trained side by side for
// `steps` steps, on batches of 8 seeded `seed` on; `after_step` checks between.
void train_beside(Model& model, const std::shared_ptr<FullyShardedDataParallel>& fsdp, Model& reference,
                  const MakeOptim& make_optim, int steps, uint64_t seed,
                  const std::function<void()>& after_step = [] {}) {
  auto optim = make_optim(fsdp->shard_parameters());
  optim->set_gradient_sync(fsdp);
  auto reference_optim = make_optim(reference.parameters());
  for (int step = 0; step < steps; ++step) {
    model.train_step(mlp_batch(8, seed + step), *optim);
    reference.train_step(mlp_batch(8, seed + step), *reference_optim);
    after_step();
  }
}

// fsdp's full weights are the float64 `reference`'s, to float32's rounding.
void expect_weights_of(FullyShardedDataParallel& fsdp, Model& reference) {
  auto weights = fsdp.full_state_dict(/*rank0_only=*/false);
  for (const auto& item : reference.named_parameters()) {
    ASSERT_TRUE(weights.count(item.key())) << item.key();
    EXPECT_TRUE(torch::allclose(weights[item.key()].to(torch::kFloat64), item.value(), 1e-4, 1e-5)) << item.key();
  }
}

TEST(FsdpSingleProcess, SequentialUnitsAreGatheredForUseAndFreedBetween) {
  ensure_world_of_one();
  auto model = std::dynamic_pointer_cast<testing::FsdpMlp>(testing::make_model("mlp", 3));
  auto reference = testing::make_model("mlp", 3);
  reference->to(torch::kFloat64);
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), linear_units());
  ASSERT_EQ(fsdp->units().size(), 4u);  // the root (gain) and three Linears
  const std::vector<std::string> paths{"", "layers.0", "layers.2", "layers.4"};
  for (size_t u = 0; u < paths.size(); ++u) EXPECT_EQ(fsdp->units()[u]->path(), paths[u]);
  EXPECT_EQ(fsdp->units()[1]->layout().numel, 16 * 24 + 24);
  // Sharded from construction on: no unit holds its gathered buffer, and
  // until a unit is intercepted its parameters are memoryless NaNs of their shapes.
  EXPECT_EQ(fsdp->memory_stats().max_gathered_units, 0);
  for (size_t u = 1; u < paths.size(); ++u) EXPECT_EQ(compat::storage_bytes(fsdp->units()[u]->full()), 0u) << u;
  torch::Tensor placeholder = model->named_parameters()["layers.0.weight"];
  EXPECT_EQ(placeholder.sizes(), (std::vector<int64_t>{24, 16}));
  EXPECT_TRUE(placeholder.isnan().all().item<bool>());
  EXPECT_EQ(compat::storage_bytes(placeholder), sizeof(double));

  train_beside(*model, fsdp, *reference, [](auto params) { return adam_over(std::move(params)); }, 5, 100, [&] {
    // Between uses the units hold no memory and their parameters are empty.
    for (size_t u = 1; u < paths.size(); ++u) {
      EXPECT_EQ(compat::storage_bytes(fsdp->units()[u]->full()), 0u) << "unit " << u;
      EXPECT_EQ(model->named_parameters()[paths[u] + ".weight"].numel(), 0) << "unit " << u;
    }
    EXPECT_EQ(model->gain.numel(), 5);  // the root stays gathered
  });
  EXPECT_LE(fsdp->memory_stats().max_gathered_units, 2);
  EXPECT_EQ(fsdp->execution_order().forward, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(fsdp->execution_order().backward, (std::vector<int>{3, 2, 1}));
  expect_weights_of(*fsdp, *reference);
  // Evaluation (no grad) gathers and frees too, and computes with the gathered parameters.
  {
    torch::NoGradGuard no_grad;
    Batch data = mlp_batch(5, 7);
    torch::Tensor out = model->predict(data).at("logits");
    EXPECT_TRUE(torch::allclose(out, reference->predict(data).at("logits"), 1e-4, 1e-5));
  }
  EXPECT_EQ(compat::storage_bytes(fsdp->units()[1]->full()), 0u);
}

// libtorch's C++ SGD updates `p.data()`, a tensor with a version counter of
// its own: the shard's counter does not move, yet the root unit (gathered all
// the time) must see every step. FSDP once trained with the root's step-0
// weights forever after an SGD step; Adam updates in place and hid it.
TEST(FsdpSingleProcess, SgdStepsReachTheUnitThatStaysGathered) {
  ensure_world_of_one();
  auto model = testing::make_model("mlp", 3);
  auto reference = testing::make_model("mlp", 3);
  reference->to(torch::kFloat64);
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), linear_units());
  auto sgd = [](std::vector<torch::Tensor> params) {
    return std::make_shared<OptimWrapper>(std::make_shared<torch::optim::SGD>(
        std::move(params), torch::optim::SGDOptions(0.2).momentum(0.9)));
  };
  train_beside(*model, fsdp, *reference, sgd, 6, 300);
  expect_weights_of(*fsdp, *reference);
}

// summon_full_params gives every parameter whole and in the shards' own
// dtype (not mixed precision's param_dtype, here float64), and writes changes
// back into the shards.
TEST(FsdpSingleProcess, SummonFullParamsIsFullPrecisionAndWritesBack) {
  ensure_world_of_one();
  auto model = std::dynamic_pointer_cast<testing::FsdpMlp>(testing::make_model("mlp", 3));
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), linear_units());
  auto optim = adam_over(fsdp->shard_parameters());
  optim->set_gradient_sync(fsdp);
  model->train_step(mlp_batch(8, 400), *optim);
  auto expected = fsdp->full_state_dict(/*rank0_only=*/false);
  {
    auto full = fsdp->summon_full_params(/*writeback=*/true);
    for (const auto& item : model->named_parameters()) {
      EXPECT_EQ(item.value().scalar_type(), torch::kFloat) << item.key();
      EXPECT_TRUE(torch::equal(item.value(), expected.at(item.key()))) << item.key();
    }
    torch::NoGradGuard no_grad;
    model->named_parameters()["layers.2.bias"].fill_(0.5);
    model->gain.fill_(2.0);
  }
  // Back to the compute dtype (the root) and placeholders (the units), with the changes kept.
  EXPECT_EQ(model->gain.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(torch::equal(model->gain, torch::full({5}, 2.0, torch::kFloat64)));
  EXPECT_EQ(model->named_parameters()["layers.2.bias"].numel(), 0);
  auto after = fsdp->full_state_dict(/*rank0_only=*/false);
  EXPECT_TRUE(torch::equal(after.at("layers.2.bias"), torch::full({24}, 0.5)));
  EXPECT_TRUE(torch::equal(after.at("layers.0.weight"), expected.at("layers.0.weight")));
}

struct MemberNet : testing::LogitsClassifier {
  MemberNet() { fc = register_module("fc", torch::nn::Linear(6, 4)); }
  torch::Tensor logits(const torch::Tensor& x) override { return fc(x); }
  torch::nn::Linear fc{nullptr};
};

TEST(FsdpSingleProcess, UnitCalledThroughAMemberWithoutScopeIsNamed) {
  ensure_world_of_one();
  auto model = std::make_shared<MemberNet>();
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), linear_units());
  auto optim = adam_over(fsdp->shard_parameters());
  optim->set_gradient_sync(fsdp);
  const std::string message = testing::error_of([&] { model->train_step(make_batch(4, 1, torch::kFloat64), *optim); });
  EXPECT_NE(message.find("fc (torch::nn::LinearImpl)"), std::string::npos) << message;
  EXPECT_NE(message.find("torch::nn::Sequential"), std::string::npos) << message;
  EXPECT_NE(message.find("unit_scope"), std::string::npos) << message;
}

struct ForgetfulBlock : torch::nn::Module {
  ForgetfulBlock() { fc = register_module("fc", torch::nn::Linear(6, 4)); }
  torch::Tensor forward(const torch::Tensor& x) {
    auto scope = fsdp::unit_scope(*this);
    return fc(x);  // should be scope.output(fc(x))
  }
  torch::nn::Linear fc{nullptr};
};

struct ForgetfulNet : testing::LogitsClassifier {
  ForgetfulNet() { block = register_module("block", std::make_shared<ForgetfulBlock>()); }
  torch::Tensor logits(const torch::Tensor& x) override { return block->forward(x); }
  std::shared_ptr<ForgetfulBlock> block;
};

TEST(FsdpSingleProcess, ScopeWithoutOutputIsAnErrorBeforeBackward) {
  ensure_world_of_one();
  auto model = std::make_shared<ForgetfulNet>();
  auto options = linear_units().auto_wrap_policy(module_type_wrap_policy({"ForgetfulBlock"}));
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), options);
  ASSERT_EQ(fsdp->units().size(), 1u);  // the block; the root holds nothing
  auto optim = adam_over(fsdp->shard_parameters());
  optim->set_gradient_sync(fsdp);
  const std::string message = testing::error_of([&] { model->train_step(make_batch(4, 1, torch::kFloat64), *optim); });
  EXPECT_NE(message.find("unit 'block'"), std::string::npos) << message;
  EXPECT_NE(message.find("scope.output(y)"), std::string::npos) << message;
}

// x -> x W^T + b with a given W.
struct Proj : torch::nn::Module {
  explicit Proj(torch::Tensor w) {
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", torch::zeros({w.size(0)}));
  }
  torch::Tensor forward(torch::Tensor x) { return x.matmul(weight.t()) + bias; }
  torch::Tensor weight, bias;
};

// The two units share one weight: it belongs to their common ancestor, the root.
struct TiedNet : Model {
  TiedNet() {
    torch::Tensor shared = torch::randn({4, 4});
    layers = register_module("layers", torch::nn::Sequential(std::make_shared<Proj>(shared), std::make_shared<Proj>(shared)));
  }
  LossDict loss(const Batch& data) override {
    LossDict losses;
    losses.insert("loss", layers->forward(data.at("x").narrow(1, 0, 4)).pow(2).mean());
    return losses;
  }
  Batch predict(const Batch& data) override { return {{"y", layers->forward(data.at("x").narrow(1, 0, 4))}}; }
  torch::nn::Sequential layers{nullptr};
};

TEST(FsdpSingleProcess, TiedParametersGoToTheCommonAncestorAndKeepAllNames) {
  ensure_world_of_one();
  torch::manual_seed(5);
  auto model = std::make_shared<TiedNet>();
  auto original = model->named_parameters()["layers.0.weight"].detach().clone();
  auto fsdp = std::make_shared<FullyShardedDataParallel>(
      model, world(), linear_units().auto_wrap_policy(module_type_wrap_policy({"Proj"})));
  ASSERT_EQ(fsdp->units().size(), 3u);
  const auto& root = fsdp->units()[0]->slots();
  ASSERT_EQ(root.size(), 1u);
  EXPECT_EQ(root[0].name, "layers.0.weight");
  EXPECT_EQ(root[0].aliases, (std::vector<std::string>{"layers.1.weight"}));
  auto weights = fsdp->full_state_dict(false);
  EXPECT_EQ(weights.size(), 4u);
  EXPECT_TRUE(torch::equal(weights["layers.1.weight"], original));

  // Loading: a changed value arrives, a missing key is reported by name.
  weights["layers.0.weight"] = weights["layers.0.weight"] + 1;
  weights["layers.1.weight"] = weights["layers.0.weight"];
  weights.erase("layers.1.bias");
  try {
    fsdp->load_full_state_dict(weights, /*strict=*/true, "test.ckpt");
    ADD_FAILURE() << "a missing key was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("layers.1.bias"), std::string::npos) << error.what();
  }
  LoadReport report = fsdp->load_full_state_dict(weights, /*strict=*/false, "test.ckpt");
  fsdp->shards_changed();  // the gathered copies follow the loaded shards
  EXPECT_EQ(report.missing, (std::vector<std::string>{"layers.1.bias"}));
  EXPECT_TRUE(torch::equal(fsdp->full_state_dict(false)["layers.1.weight"], original + 1));
  EXPECT_TRUE(torch::equal(model->named_parameters()["layers.0.weight"].to(torch::kFloat), original + 1));
}

// mp_policy.output_dtype: every unit's output is cast to it and, with the
// model's output dtype set as FSDPStrategy sets it, so are the model's
// predictions; the next unit casts its input back to param_dtype. Without it
// everything stays in param_dtype.
TEST(FsdpSingleProcess, OutputDtypeCastsEveryUnitsOutputAndTheModels) {
  ensure_world_of_one();
  for (bool cast_outputs : {false, true}) {
    auto model = std::dynamic_pointer_cast<testing::FsdpMlp>(testing::make_model("mlp", 3));
    MixedPrecision precision = MixedPrecision().param_dtype(torch::kFloat64).cast_forward_inputs(true);
    if (cast_outputs) precision.output_dtype(torch::kFloat32);
    auto fsdp = std::make_shared<FullyShardedDataParallel>(
        model, world(), linear_units().per_parameter_sharding(true).mixed_precision(precision));
    model->set_output_dtype(precision.output_dtype());
    const torch::Dtype expected = cast_outputs ? torch::kFloat32 : torch::kFloat64;
    Batch data = mlp_batch(5, 7);
    torch::Tensor units_out = model->layers->forward(data.at("x"));
    EXPECT_EQ(units_out.scalar_type(), expected) << "output_dtype " << cast_outputs;
    // The root multiplies by its float64 gain: float64 until the model's output is cast.
    EXPECT_EQ(model->val_step(data).at("logits").scalar_type(), expected) << "output_dtype " << cast_outputs;
    auto optim = adam_over(fsdp->shard_parameters());
    optim->set_gradient_sync(fsdp);
    const double loss = model->train_step(data, *optim).at("loss");
    EXPECT_TRUE(std::isfinite(loss));
  }
}

// A unit's trainable parameters share one dtype (their gradients are
// reduced together); only frozen ones may differ (Note [A unit of several
// dtypes]). The error names the unit and both parameters.
TEST(FsdpSingleProcess, FullyShardRefusesTrainableParametersOfTwoDtypesInOneUnit) {
  ensure_world_of_one();
  auto model = testing::make_model("mlp", 3);
  auto bias = model->named_parameters()["layers.2.bias"];
  bias.set_data(bias.detach().to(torch::kBFloat16));
  try {
    FullyShardedDataParallel fsdp(model, world(),
                                  FSDPOptions().auto_wrap_policy(module_type_wrap_policy({"Linear"})).per_parameter_sharding(true));
    ADD_FAILURE() << "two trainable dtypes in one unit were accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'layers.2' trains layers.2.weight in Float and layers.2.bias in BFloat16"), std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace lockstep
