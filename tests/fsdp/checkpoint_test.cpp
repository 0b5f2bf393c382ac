// FSDPStrategy checkpoints across real processes, with the small transformer
// (tied embedding in the root, blocks as units):
//   - full: one file, written by rank 0, loads into a single-process model
//     (SingleDeviceStrategy) that then gives the same outputs as the FSDP
//     model, and resumes there (optimizer state converted) to the same
//     parameters as FSDP continuing; a full file from 2 ranks also resumes
//     FSDP on 4 ranks;
//   - sharded: one file per rank plus a manifest; a fresh FSDP model resumes
//     from it bitwise (parameters and optimizer state);
//   - resharded (FsdpReshardWorker): FULL_SHARD checkpoints written by 2
//     ranks (flat shards, and use_orig_params) load on 1, 3 and 4 ranks. Each
//     run saves what it loaded as a full checkpoint, which must equal, bitwise,
//     the full checkpoint of the 2 ranks' own state (parameters, tied names,
//     buffers, Adam's moments and steps), and then trains on exactly as a run
//     that loaded that full checkpoint. Each rank reads only what overlaps its
//     shards: at 4 ranks, half of the saved model bytes or less;
//   - FullyShard (FSDP2): a full checkpoint resumes a fresh model bitwise.
// Each part starts a world of its own (a strategy owns groups named per world).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/checkpoint/sharded_checkpoint.h"
#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
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

std::shared_ptr<FSDPStrategy> fsdp_strategy(const std::string& state_dict_type, const std::string& sharding,
                                           bool use_orig_params = false) {
  const std::string yaml = "launcher: pytorch\nstate_dict_type: " + state_dict_type +
                           "\nmodel_wrapper:\n  sharding_strategy: " + sharding +
                           "\n  hybrid_shard_size: 2\n  auto_wrap_policy: {type: module_type, module_types: [Block]}\n" +
                           (use_orig_params ? "  use_orig_params: true\n" : "");
  return std::make_shared<FSDPStrategy>(parse_fsdp_strategy_options(parse_config(yaml, "fsdp strategy")));
}

// Prepares `strategy` with a fresh GPT (seeded with `seed`) and Adam.
std::shared_ptr<Model> prepare(Strategy& strategy, uint64_t seed) {
  auto model = testing::make_model("gpt", seed);
  strategy.prepare(model, parse_config(testing::adam_config()), Config(), SchedulerContext{});
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

// On 4 ranks: the 2-rank sharded checkpoint's flat optimizer state is
// refused by a use_orig_params run (it reshards, but not between optimizer
// layouts), the full one resumes.
void checkpoints_from_two_ranks() {
  SCOPED_TRACE("checkpoints written by 2 ranks, read by 4");
  const std::string dir = directory_for(2);
  {
    testing::WorkerWorld world_guard;
    auto orig = fsdp_strategy("full", "FULL_SHARD", /*use_orig_params=*/true);
    prepare(*orig, 8);
    try {
      orig->load_checkpoint(dir + "/sharded.ckpt", true, true);
      ADD_FAILURE() << "flat optimizer shards loaded into a use_orig_params optimizer";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("saved with use_orig_params: false and this run has true"), std::string::npos) << message;
      EXPECT_NE(message.find("state_dict_type: full"), std::string::npos) << message;
    }
  }
  testing::WorkerWorld world_guard;
  auto strategy = fsdp_strategy("full", "FULL_SHARD");
  prepare(*strategy, 8);
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

// Resharding. The 2-rank launch writes, per layout, a sharded checkpoint and
// (loading it back at 2 ranks, the bitwise path above) the full checkpoint of
// the same state; the launches at 1, 3 and 4 ranks read the sharded one.
std::string reshard_dir(bool use_orig_params) {
  return directory_for(2) + (use_orig_params ? "/reshard_orig" : "/reshard_flat");
}

void write_for_resharding(bool use_orig_params) {
  const std::string dir = reshard_dir(use_orig_params);
  std::filesystem::create_directories(dir);
  {
    testing::WorkerWorld world_guard;
    auto strategy = fsdp_strategy("sharded", "FULL_SHARD", use_orig_params);
    prepare(*strategy, 7);
    train(*strategy, 0, kStepsBefore);
    strategy->save_checkpoint(dir + "/sharded.ckpt", CheckpointContents(), CheckpointOptions());
  }
  testing::WorkerWorld world_guard;
  auto strategy = fsdp_strategy("full", "FULL_SHARD", use_orig_params);
  prepare(*strategy, 8);
  strategy->load_checkpoint(dir + "/sharded.ckpt", /*load_optimizer=*/true, /*load_schedulers=*/true);
  strategy->save_checkpoint(dir + "/original_full.ckpt", CheckpointContents(), CheckpointOptions());
}

// Every tensor and the optimizer's values of two full checkpoints, bitwise.
void expect_same_full_state(const std::string& actual_path, const std::string& expected_path, const std::string& what) {
  const State actual = read_checkpoint_file(actual_path);
  const State expected = read_checkpoint_file(expected_path);
  for (const char* part : {"model", "optim_wrapper"}) {
    const State a = actual.get(part);
    const State e = expected.get(part);
    EXPECT_FALSE(e.tensors.empty()) << what << ": the original has no " << part;
    EXPECT_EQ(a.tensors.size(), e.tensors.size()) << what << ": " << part;
    testing::expect_matches(a.tensors, e.tensors, 0, 0, what + ", " + part);
    EXPECT_EQ(a.values, e.values) << what << ": " << part << " values";
  }
}

void read_resharded(bool use_orig_params) {
  const int world = launched_world_size();
  const std::string dir = reshard_dir(use_orig_params);
  const std::string what = std::string(use_orig_params ? "use_orig_params" : "flat shards") + ", 2 ranks' shards on " +
                           std::to_string(world);
  SCOPED_TRACE(what);
  const std::string exported = dir + "/resharded_full_" + std::to_string(world) + ".ckpt";
  std::map<std::string, torch::Tensor> continued;
  {
    testing::WorkerWorld world_guard;
    auto strategy = fsdp_strategy("full", "FULL_SHARD", use_orig_params);
    prepare(*strategy, 9);  // other initial values: everything must come from the files
    strategy->load_checkpoint(dir + "/sharded.ckpt", /*load_optimizer=*/true, /*load_schedulers=*/true);
    strategy->save_checkpoint(exported, CheckpointContents(), CheckpointOptions());
    train(*strategy, kStepsBefore, kStepsAfter);
    continued = strategy->fsdp()->full_state_dict(/*rank0_only=*/false);

    // What this rank read of the saved model: its own part, not the model.
    ShardedCheckpoint saved(dir + "/sharded.ckpt", *read_checkpoint(dir + "/sharded.ckpt").sharding);
    const std::vector<StateReader> parts = saved.model_parts();
    uint64_t model_bytes = 0;
    for (const auto& part : parts) {
      for (const auto& key : part.keys()) {
        if (key.rfind("shards/", 0) == 0) model_bytes += part.entry(key).numel() * c10::elementSize(part.entry(key).dtype);
      }
    }
    const uint64_t before = saved.bytes_read();
    strategy->fsdp()->resharded_state_dict(saved.layout(), parts);
    const uint64_t read = saved.bytes_read() - before;
    std::cout << "rank " << get_rank() << " of " << world << " read " << read << " of " << model_bytes
              << " bytes of saved shards (plus buffers)\n";
    if (world == 4) EXPECT_LE(read, model_bytes / 2 + 4096) << "rank " << get_rank();
  }
  if (launched_rank() == 0) expect_same_full_state(exported, dir + "/original_full.ckpt", what);  // rank 0 wrote it
  // Training on equals a run that loaded the full checkpoint of the same state.
  testing::WorkerWorld world_guard;
  auto reference = fsdp_strategy("full", "FULL_SHARD", use_orig_params);
  prepare(*reference, 10);
  reference->load_checkpoint(dir + "/original_full.ckpt", /*load_optimizer=*/true, /*load_schedulers=*/true);
  train(*reference, kStepsBefore, kStepsAfter);
  testing::expect_matches(continued, reference->fsdp()->full_state_dict(/*rank0_only=*/false), 0, 0,
                          what + ", trained on");
}

// FullyShard (FSDP2) saves a full checkpoint (its only kind); a fresh
// FullyShard model resumes from it bitwise: each parameter's rows and Adam's
// moments go through the whole-tensor layout and back.
void fully_shard_full_checkpoint_resumes_bitwise() {
  SCOPED_TRACE("FullyShard, full checkpoint");
  const std::string path = directory_for(launched_world_size()) + "/fully_shard_full.ckpt";
  auto strategy_of = [] {
    return std::make_shared<FSDPStrategy>(parse_fsdp_strategy_options(parse_config(
        "launcher: pytorch\nstate_dict_type: full\nmodel_wrapper:\n  type: FullyShard\n"
        "  auto_wrap_policy: {type: module_type, module_types: [Block]}\n",
        "fully_shard strategy")));
  };
  std::map<std::string, torch::Tensor> uninterrupted;
  {
    testing::WorkerWorld world_guard;
    auto strategy = strategy_of();
    prepare(*strategy, 7);
    train(*strategy, 0, kStepsBefore);
    strategy->save_checkpoint(path, CheckpointContents(), CheckpointOptions());
    train(*strategy, kStepsBefore, kStepsAfter);
    uninterrupted = strategy->fsdp()->full_state_dict(/*rank0_only=*/false);
  }
  testing::WorkerWorld world_guard;
  auto strategy = strategy_of();
  prepare(*strategy, 8);  // other initial values: everything must come from the file
  strategy->load_checkpoint(path, /*load_optimizer=*/true, /*load_schedulers=*/true);
  train(*strategy, kStepsBefore, kStepsAfter);
  testing::expect_matches(strategy->fsdp()->full_state_dict(/*rank0_only=*/false), uninterrupted, 0, 0,
                          "resumed on rank " + std::to_string(get_rank()));
}

LOCKSTEP_WORKER_TEST(FsdpReshardWorker, TwoRanksShardsOnOtherWorldSizes) {
  if (launched_world_size() == 2) {
    for (bool orig : {false, true}) write_for_resharding(orig);
    return;
  }
  for (bool orig : {false, true}) read_resharded(orig);
}

LOCKSTEP_WORKER_TEST(FsdpWorker, Checkpoints) {
  const bool four = launched_world_size() == 4;
  sharded_checkpoint_resumes_bitwise(four ? "HYBRID_SHARD" : "FULL_SHARD");
  full_checkpoint_loads_into_one_process();
  fully_shard_full_checkpoint_resumes_bitwise();
  if (four) checkpoints_from_two_ranks();
}

}  // namespace
}  // namespace lockstep
