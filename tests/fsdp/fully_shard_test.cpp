// FullyShard (FSDP2) across real processes: a parameter the loss never
// reaches keeps no gradient on any rank, so AdamW neither decays nor moves
// it, as PyTorch's fully_shard and DDP leave it; FSDP1's flat parameter
// reduces zeros for it and AdamW decays it (Note [FSDP2's gradients]);
// reshard_after_forward: 2 holds half the parameters between forward and
// backward; frozen parameters are sharded with their unit and never stepped,
// whatever their dtype (a bf16 base beside fp32 adapters in one unit).
//
// The parent test that launches these workers is in fsdp_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/optim/adam.h"
#include "lockstep/parallel/fsdp/unit_scope.h"
#include "tests/fsdp/fsdp_test_util.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

// FsdpMlp whose root holds, besides `gain`, a parameter forward never reads.
struct MlpWithUnusedParameter : testing::FsdpMlp {
  MlpWithUnusedParameter() { unused = register_parameter("unused", torch::ones({7})); }
  torch::Tensor unused;
};

struct AfterTraining {
  torch::Tensor unused;  // its value after the steps
  torch::Tensor gain_before, gain;
};

// Three AdamW steps with weight decay; an AdamW step decays every parameter
// that has a gradient, a zero one included, and skips one without.
AfterTraining train_with_weight_decay(bool per_parameter) {
  torch::manual_seed(7);
  auto model = std::make_shared<MlpWithUnusedParameter>();
  const auto options = FSDPOptions()
                           .auto_wrap_policy(testing::policy_for("mlp"))
                           .use_orig_params(true)
                           .per_parameter_sharding(per_parameter);
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), options);
  auto optimizer = std::make_shared<AdamW>(testing::fsdp_optimizer_parameters(*fsdp),
                                           torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  auto optim = std::make_shared<OptimWrapper>(optimizer);
  optim->set_gradient_sync(fsdp);
  optim->initialize_count_status(0, 3);
  AfterTraining after;
  after.gain_before = fsdp->full_state_dict(/*rank0_only=*/false).at("gain");
  const int64_t global = testing::kPerRank * get_world_size();
  for (int64_t step = 0; step < 3; ++step) {
    Batch batch = testing::global_batch("mlp", global, static_cast<uint64_t>(2000 + step));
    model->train_step(batch.slice(get_rank() * testing::kPerRank, testing::kPerRank), *optim);
  }
  const auto weights = fsdp->full_state_dict(/*rank0_only=*/false);
  after.unused = weights.at("unused");
  after.gain = weights.at("gain");
  return after;
}

LOCKSTEP_WORKER_TEST(FsdpWorker, FullyShardLeavesAnUnusedParameterAlone) {
  testing::WorkerWorld world_guard;
  const AfterTraining fsdp2 = train_with_weight_decay(/*per_parameter=*/true);
  EXPECT_TRUE(torch::equal(fsdp2.unused, torch::ones({7}))) << "FullyShard decayed the unused parameter: "
                                                            << fsdp2.unused;
  EXPECT_FALSE(torch::equal(fsdp2.gain, fsdp2.gain_before)) << "the used parameters did not train";
  // The control: FSDP1's flat parameter reduces zeros for it, and AdamW decays it.
  const AfterTraining fsdp1 = train_with_weight_decay(/*per_parameter=*/false);
  EXPECT_LT(fsdp1.unused.max().item<double>(), 1.0) << "FSDP1 was expected to decay the unused parameter";
}

// reshard_after_forward: 2 on 4 ranks: between a unit's forward and its
// backward, each rank holds the unit's parameters sharded two ways (half of
// them, padded per parameter), not four ways and not whole.
LOCKSTEP_WORKER_TEST(FsdpWorker, FullyShardReshardsToPairsAfterForward) {
  testing::WorkerWorld world_guard;
  if (get_world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  torch::manual_seed(7);
  auto model = std::make_shared<testing::FsdpMlp>();
  const auto options = FSDPOptions()
                           .auto_wrap_policy(testing::policy_for("mlp"))
                           .per_parameter_sharding(true)
                           .reshard_after_forward_to(2);
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), options);
  Batch batch = testing::global_batch("mlp", testing::kPerRank * 4, 3000).slice(get_rank() * testing::kPerRank,
                                                                               testing::kPerRank);
  fsdp->begin_forward(/*sync=*/true);
  torch::Tensor loss = torch::nn::functional::cross_entropy(model->logits(batch.at("x")), batch.at("y"));
  for (const auto& unit : fsdp->units()) {
    if (unit->setup().persistent) continue;
    int64_t half = 0;  // this rank's rows of each parameter, split 2 ways, padded
    for (const auto& slot : unit->slots()) half += (slot.shape[0] + 1) / 2 * (slot.numel / slot.shape[0]);
    EXPECT_EQ(unit->state(), fsdp::FlatParamUnit::State::kSharded) << unit->path();
    EXPECT_EQ(unit->gathered_bytes(), half * 4) << unit->path() << ": the 2-way part, float32";
  }
  fsdp->begin_backward(loss, /*sync=*/true, /*iteration=*/0);
  loss.backward();
  fsdp->end_backward(/*sync=*/true);
  for (const auto& unit : fsdp->units()) {
    if (!unit->setup().persistent) EXPECT_EQ(unit->gathered_bytes(), 0) << unit->path() << " after backward";
  }
}

// LoRA-style fine-tuning: the first Linear frozen. FullyShard shards it with
// its unit (each rank holds its rows, as fully_shard does), no optimizer sees
// it, it never changes, and the rest trains as one process does on the whole
// batch.
LOCKSTEP_WORKER_TEST(FsdpWorker, FullyShardShardsFrozenParametersAndTrainsTheRest) {
  testing::WorkerWorld world_guard;
  auto make = [] {
    auto model = testing::make_model("mlp");
    for (auto& item : model->named_parameters()) {
      if (item.key().rfind("layers.0.", 0) == 0) item.value().requires_grad_(false);
    }
    return model;
  };
  constexpr int64_t kSteps = 5;
  const int64_t global = testing::kPerRank * get_world_size();
  auto reference = make();
  const torch::Tensor frozen_before = reference->named_parameters()["layers.0.weight"].detach().clone();
  auto reference_optim = testing::adam(testing::unique_parameters(*reference));
  reference_optim->initialize_count_status(0, kSteps);
  for (int64_t step = 0; step < kSteps; ++step) {
    reference->train_step(testing::global_batch("mlp", global, static_cast<uint64_t>(4000 + step)), *reference_optim);
  }

  auto model = make();
  auto fsdp = std::make_shared<FullyShardedDataParallel>(
      model, world(), FSDPOptions().auto_wrap_policy(testing::policy_for("mlp")).per_parameter_sharding(true));
  for (const auto& [name, param] : fsdp->named_orig_parameters()) {
    EXPECT_EQ(name.rfind("layers.0.", 0), std::string::npos) << name << " is frozen: no optimizer may step it";
  }
  for (const auto& unit : fsdp->units()) {
    if (unit->path() != "layers.0") continue;
    EXPECT_EQ(unit->layout().shard_numel, (24 + get_world_size() - 1) / get_world_size() * 17)
        << "the frozen Linear(16, 24): this rank's rows of its weight and bias";
  }
  auto optim = testing::adam(testing::fsdp_optimizer_parameters(*fsdp));
  optim->set_gradient_sync(fsdp);
  optim->initialize_count_status(0, kSteps);
  for (int64_t step = 0; step < kSteps; ++step) {
    Batch batch = testing::global_batch("mlp", global, static_cast<uint64_t>(4000 + step));
    model->train_step(batch.slice(get_rank() * testing::kPerRank, testing::kPerRank), *optim);
  }
  const auto weights = fsdp->full_state_dict(/*rank0_only=*/false);
  EXPECT_TRUE(torch::equal(weights.at("layers.0.weight"), frozen_before)) << "the frozen weight changed";
  testing::expect_matches(weights, testing::parameters_of(*reference), 1e-5, 1e-6, "FullyShard with a frozen layer");
}

// peft's LoRA layer over a base kept in bf16 (autocast_adapter_dtype): the
// frozen base computes in bf16, the fp32 adapters in fp32, and their sum
// goes on in fp32. One FSDP unit holds both dtypes.
struct LoraLinearImpl : torch::nn::Module {
  LoraLinearImpl(int64_t in, int64_t out, int64_t rank) {
    base = register_module("base", torch::nn::Linear(in, out));
    base->to(torch::kBFloat16);
    base->weight.requires_grad_(false);
    base->bias.requires_grad_(false);
    lora_a = register_parameter("lora_a", torch::randn({rank, in}) / std::sqrt(static_cast<double>(in)));
    lora_b = register_parameter("lora_b", torch::randn({out, rank}) * 0.1);
  }
  torch::Tensor forward(torch::Tensor x) {
    auto scope = fsdp::unit_scope(*this);
    x = scope.input(x);
    torch::Tensor y = base(x.to(torch::kBFloat16)).to(torch::kFloat) + torch::mm(torch::mm(x, lora_a.t()), lora_b.t());
    return scope.output(y);
  }
  torch::nn::Linear base{nullptr};
  torch::Tensor lora_a, lora_b;
};
TORCH_MODULE(LoraLinear);

struct LoraMlp : testing::LogitsClassifier {
  LoraMlp() {
    first = register_module("first", LoraLinear(16, 24, 4));
    second = register_module("second", LoraLinear(24, 5, 2));
  }
  torch::Tensor logits(const torch::Tensor& x) override { return second(torch::tanh(first(x))); }
  LoraLinear first{nullptr}, second{nullptr};
};

// Note [A unit of several dtypes]: each LoraLinear is a leader holding its
// fp32 adapters and a companion holding its bf16 base, gathered and freed
// together; the base stays bf16 and bitwise unchanged, and the adapters train
// as one process does that sums each rank's gradients and then divides, as
// fully_shard averages. (Not as one process on the whole batch, nor one that
// divides each loss before its backward: through the bf16 base the gradient
// of a loss scaled by 1/N or 1/(N * batch) rounds differently, 0.2 to 0.5%
// apart here, which Adam's first steps turn into 1e-3 of a weight.)
LOCKSTEP_WORKER_TEST(FsdpWorker, FullyShardKeepsAFrozenBf16BaseBesideFp32AdaptersInOneUnit) {
  testing::WorkerWorld world_guard;
  constexpr int64_t kSteps = 4;
  const int world_size = get_world_size();
  const int64_t global = testing::kPerRank * world_size;
  auto make = [] {
    torch::manual_seed(11);
    return std::make_shared<LoraMlp>();
  };
  auto reference = make();
  const auto before = testing::parameters_of(*reference);
  torch::optim::Adam reference_adam(testing::unique_parameters(*reference),
                                    torch::optim::AdamOptions(testing::kAdamLr).eps(testing::kAdamEps));
  for (int64_t step = 0; step < kSteps; ++step) {
    Batch batch = testing::global_batch("mlp", global, static_cast<uint64_t>(5000 + step));
    for (int rank = 0; rank < world_size; ++rank) {
      reference->loss(batch.slice(rank * testing::kPerRank, testing::kPerRank)).begin()->value().backward();
    }
    for (auto& param : reference->parameters()) {
      if (param.grad().defined()) param.mutable_grad().div_(world_size);
    }
    reference_adam.step();
    reference_adam.zero_grad();
  }

  auto model = make();
  auto fsdp = std::make_shared<FullyShardedDataParallel>(
      model, world(), FSDPOptions().auto_wrap_policy(module_type_wrap_policy({"LoraLinear"})).per_parameter_sharding(true));
  std::vector<std::string> paths;
  for (const auto& unit : fsdp->units()) paths.push_back(unit->path() + ":" + c10::toString(unit->shard().scalar_type()));
  EXPECT_EQ(paths, (std::vector<std::string>{"first:Float", "first[BFloat16]:BFloat16", "second:Float",
                                             "second[BFloat16]:BFloat16"}));
  auto optim = testing::adam(testing::fsdp_optimizer_parameters(*fsdp));
  optim->set_gradient_sync(fsdp);
  EXPECT_EQ(fsdp->named_orig_parameters().size(), 4u) << "the optimizer sees the four adapters only";
  for (int64_t step = 0; step < kSteps; ++step) {
    Batch batch = testing::global_batch("mlp", global, static_cast<uint64_t>(5000 + step));
    model->train_step(batch.slice(get_rank() * testing::kPerRank, testing::kPerRank), *optim);
    for (const auto& unit : fsdp->units()) EXPECT_EQ(unit->gathered_bytes(), 0) << unit->path() << " after step " << step;
  }
  EXPECT_LE(fsdp->memory_stats().max_gathered_units, 2) << "a leader and its companion count as one unit";
  const auto weights = fsdp->full_state_dict(/*rank0_only=*/false);
  for (const std::string name : {"first.base.weight", "first.base.bias", "second.base.weight", "second.base.bias"}) {
    EXPECT_EQ(weights.at(name).scalar_type(), torch::kBFloat16) << name;
    EXPECT_TRUE(torch::equal(weights.at(name), before.at(name))) << name << " is frozen and changed";
  }
  EXPECT_FALSE(torch::equal(weights.at("first.lora_a"), before.at("first.lora_a"))) << "the adapters did not train";
  testing::expect_matches(weights, testing::parameters_of(*reference), 1e-5, 1e-6, "FullyShard, bf16 base + fp32 LoRA");
}

}  // namespace
}  // namespace lockstep
