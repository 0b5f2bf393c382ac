// FSDPStrategy checkpoints across real processes, with the small transformer
// (tied embedding in the root, blocks as units):
//   - full: one file, written by rank 0, loads into a single-process model
//     (SingleDeviceStrategy) that then gives the same outputs as the FSDP
//     model, and resumes there (optimizer state converted) to the same
//     parameters as FSDP continuing; a full file from 2 ranks also resumes
//     FSDP on 4 ranks;
//   - sharded: one file per rank plus a manifest; a fresh FSDP model resumes
//     from it bitwise (parameters and optimizer state), and a run with another
//     number of ranks refuses it with a message that says why.
// Each part starts a world of its own (a strategy owns groups named per world).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/core/error.h"
#include "lockstep/dist/comm.h"
#include "lockstep/dist/init.h"
#include "lockstep/strategy/fsdp_strategy.h"
#include "tests/fsdp/fsdp_test_util.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

constexpr int64_t kStepsBefore = 3;
constexpr int64_t kStepsAfter = 3;

// From the launcher's environment: valid between worlds too.
int launched_rank() { return std::stoi(testing::env_or("RANK", "0")); }
int launched_world_size() { return std::stoi(testing::env_or("WORLD_SIZE", "1")); }

std::string directory_for(int world_size) {
  const std::string root = testing::env_or("FSDP_TEST_DIR");
  EXPECT_FALSE(root.empty()) << "FSDP_TEST_DIR must name a directory every rank can reach";
  const std::string path = root + "/world" + std::to_string(world_size);
  std::filesystem::create_directories(path);
  return path;
}

std::shared_ptr<FSDPStrategy> fsdp_strategy(const std::string& state_dict_type, const std::string& sharding) {
  const std::string yaml = "launcher: pytorch\nstate_dict_type: " + state_dict_type +
                           "\nmodel_wrapper:\n  sharding_strategy: " + sharding +
                           "\n  hybrid_shard_size: 2\n  auto_wrap_policy: {type: module_type, module_types: [Block]}\n";
  return std::make_shared<FSDPStrategy>(parse_fsdp_strategy_options(Config::parse(yaml, "fsdp strategy")));
}

// Prepares `strategy` with a fresh GPT (seeded with `seed`) and Adam.
std::shared_ptr<Model> prepare(Strategy& strategy, uint64_t seed) {
  auto model = testing::make_model("gpt", seed);
  strategy.prepare(model, Config::parse(testing::adam_config()), Config(), SchedulerContext{});
  return model;
}

// Steps [first, first + count) of FSDP training, each rank on its slice.
void train(Strategy& strategy, int64_t first, int64_t count) {
  const int rank = get_rank();
  for (int64_t step = first; step < first + count; ++step) {
    Batch batch = testing::global_batch("gpt", testing::kPerRank * get_world_size(), static_cast<uint64_t>(2000 + step));
    strategy.model()->run_train_step(batch.slice(rank * testing::kPerRank, testing::kPerRank), *strategy.optim_wrapper());
  }
}

// The same steps in one process on the whole batch of `world_size` ranks.
void train_whole(Strategy& strategy, int64_t first, int64_t count, int world_size) {
  for (int64_t step = first; step < first + count; ++step) {
    Batch batch = testing::global_batch("gpt", testing::kPerRank * world_size, static_cast<uint64_t>(2000 + step));
    strategy.model()->run_train_step(batch, *strategy.optim_wrapper());
  }
}

torch::Tensor predict(Model& model) {
  torch::NoGradGuard no_grad;
  return model.predict(testing::global_batch("gpt", 5, 77)).at("logits");
}

std::map<std::string, torch::Tensor> shards_and_optimizer_of(FSDPStrategy& strategy) {
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [name, shard] : strategy.fsdp()->named_shard_parameters()) tensors["shard " + name] = shard.detach().clone();
  for (const auto& [name, tensor] : strategy.optim_wrapper()->state().tensors) tensors["optimizer " + name] = tensor.clone();
  return tensors;
}

void sharded_checkpoint_resumes_bitwise(const std::string& sharding) {
  SCOPED_TRACE("sharded checkpoint, " + sharding);
  const std::string path = directory_for(launched_world_size()) + "/sharded.ckpt";
  std::map<std::string, torch::Tensor> uninterrupted;
  {
    testing::WorkerWorld world_guard;
    auto strategy = fsdp_strategy("sharded", sharding);
    prepare(*strategy, 7);
    train(*strategy, 0, kStepsBefore);
    strategy->save_checkpoint(path, CheckpointContents(), CheckpointOptions());
    train(*strategy, kStepsBefore, kStepsAfter);
    uninterrupted = shards_and_optimizer_of(*strategy);
  }
  EXPECT_TRUE(testing::file_exists(path)) << "the manifest";
  EXPECT_TRUE(testing::file_exists(shard_path(path, launched_rank(), launched_world_size()))) << "this rank's file";
  testing::WorkerWorld world_guard;
  auto strategy = fsdp_strategy("sharded", sharding);
  prepare(*strategy, 8);  // other initial values: everything must come from the files
  strategy->load_checkpoint(path, /*load_optimizer=*/true, /*load_schedulers=*/true);
  train(*strategy, kStepsBefore, kStepsAfter);
  testing::expect_matches(shards_and_optimizer_of(*strategy), uninterrupted, 0, 0, "resumed on rank " + std::to_string(get_rank()));
}

// FSDP saves a full checkpoint; rank 0 loads it into one process, which
// predicts the same and then trains on to the same parameters as FSDP.
void full_checkpoint_loads_into_one_process() {
  SCOPED_TRACE("full checkpoint");
  const std::string path = directory_for(launched_world_size()) + "/full.ckpt";
  testing::WorkerWorld world_guard;
  auto strategy = fsdp_strategy("full", "SHARD_GRAD_OP");
  auto model = prepare(*strategy, 7);
  train(*strategy, 0, kStepsBefore);
  strategy->save_checkpoint(path, CheckpointContents(), CheckpointOptions());
  torch::Tensor outputs = predict(*model);
  train(*strategy, kStepsBefore, kStepsAfter);
  auto continued = strategy->fsdp()->full_state_dict(/*rank0_only=*/true);
  if (get_rank() != 0) return;
  SingleDeviceStrategy single;
  auto plain = prepare(single, 8);
  single.load_checkpoint(path, /*load_optimizer=*/true, /*load_schedulers=*/false);
  torch::Tensor single_outputs = predict(*plain);
  EXPECT_TRUE(torch::allclose(single_outputs, outputs, 1e-6, 1e-7))
      << "max |diff| " << (single_outputs - outputs).abs().max().item<double>();
  train_whole(single, kStepsBefore, kStepsAfter, get_world_size());
  testing::expect_matches(continued, testing::parameters_of(*plain), 1e-5, 1e-6, "one process resumed from FSDP's file");
}

// On 4 ranks: the 2-rank sharded checkpoint is refused, the full one resumes.
void checkpoints_from_two_ranks() {
  SCOPED_TRACE("checkpoints written by 2 ranks, read by 4");
  const std::string dir = directory_for(2);
  testing::WorkerWorld world_guard;
  auto strategy = fsdp_strategy("full", "FULL_SHARD");
  prepare(*strategy, 8);
  try {
    strategy->load_checkpoint(dir + "/sharded.ckpt", true, true);
    ADD_FAILURE() << "a sharded checkpoint of 2 ranks loaded into 4";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("written by 2 ranks cannot load into 4 ranks"), std::string::npos) << message;
    EXPECT_NE(message.find("state_dict_type: full"), std::string::npos) << message;
  }
  const std::string full = dir + "/full.ckpt";
  strategy->load_checkpoint(full, /*load_optimizer=*/true, /*load_schedulers=*/false);
  auto loaded = strategy->fsdp()->full_state_dict(/*rank0_only=*/false);
  testing::expect_matches(loaded, read_checkpoint_file(full).get("model").tensors, 0, 0, "loaded from 2 ranks' file");
  train(*strategy, kStepsBefore, kStepsAfter);
  auto continued = strategy->fsdp()->full_state_dict(/*rank0_only=*/true);
  if (get_rank() != 0) return;
  SingleDeviceStrategy single;
  auto plain = prepare(single, 9);
  single.load_checkpoint(full, true, false);
  train_whole(single, kStepsBefore, kStepsAfter, get_world_size());
  testing::expect_matches(continued, testing::parameters_of(*plain), 1e-5, 1e-6, "4 ranks resumed from 2 ranks' file");
}

LOCKSTEP_WORKER_TEST(FsdpWorker, Checkpoints) {
  const bool four = launched_world_size() == 4;
  sharded_checkpoint_resumes_bitwise(four ? "HYBRID_SHARD" : "FULL_SHARD");
  full_checkpoint_loads_into_one_process();
  if (four) checkpoints_from_two_ranks();
}

}  // namespace
}  // namespace lockstep
