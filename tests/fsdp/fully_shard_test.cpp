// FullyShard (FSDP2) across real processes: a parameter the loss never
// reaches keeps no gradient on any rank, so AdamW neither decays nor moves
// it, as PyTorch's fully_shard and DDP leave it; FSDP1's flat parameter
// reduces zeros for it and AdamW decays it (Note [FSDP2's gradients]).
//
// The parent test that launches these workers is in fsdp_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/optim/adam.h"
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

}  // namespace
}  // namespace lockstep
