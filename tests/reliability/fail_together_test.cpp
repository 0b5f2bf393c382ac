// Failing together, and fast: when one rank's part of a step or of a
// checkpoint fails, every rank ends with that rank's error within seconds --
// also when the failing rank catches its error and stays alive, which a
// program that owns its loop does -- instead of waiting out the collective
// timeout (30 minutes) in a collective the failed rank never joins.
//
//   - DDP drops a step that failed on one rank (in forward, in backward, or
//     with parameters left without gradients) on every rank, and the program
//     can go on: the weights then equal a run that skipped that step;
//   - a failure after the reduction (the optimizer step) cannot be dropped:
//     the next step fails on every rank, naming the rank;
//   - FSDP cannot drop a sharded step: the failing rank gets an error saying
//     so, and so does every later step it tries;
//   - rank 0's checkpoint write, a rank's shard write and a rank's read of
//     the checkpoint chosen for resuming fail on every rank, and what was
//     saved before stays.
// The timeout is left at its default in every scenario.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <thread>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/parallel/ddp/distributed_data_parallel.h"
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"
#include "lockstep/parallel/fsdp/wrap_policy.h"
#include "lockstep/runner/runner.h"
#include "tests/parallel/ddp_models.h"
#include "tests/support/small_job.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

using testing::contains;

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

// DdpMlp whose step fails on the failing rank at one call, in the way
// FAIL_MODE says: "forward" (the loss throws), "backward" (a gradient hook
// throws inside autograd), "unready" (fc1 gets no gradient: its buckets
// cannot be reduced), "after" (the trainer's after_backward point, once the
// gradients are reduced: the optimizer step never happens there).
struct FailingMlp : testing::DdpMlp {
  FailingMlp(std::string mode, int64_t fail_at_call) : mode(std::move(mode)), fail_at(fail_at_call) {}
  LossDict loss(const Batch& data) override {
    const bool fail = calls++ == fail_at;
    if (fail && mode == "forward") throw Error("boom in forward");
    torch::Tensor h = torch::relu(fc1(data.at("x")));
    if (fail && mode == "unready") h = h.detach();
    torch::Tensor out = fc2(h);
    if (fail && mode == "backward") {
      out.register_hook([](const torch::Tensor&) -> torch::Tensor { throw Error("boom in backward"); });
    }
    LossDict losses;
    losses.insert("loss", torch::nn::functional::cross_entropy(out, data.at("y")));
    return losses;
  }
  std::string mode;
  int64_t fail_at;
  int64_t calls = 0;
};

constexpr int64_t kSteps = 6;
constexpr int64_t kFailStep = 3;
constexpr int64_t kPerRank = 6;

// Every rank's parameters, bitwise, against rank 0's.
void expect_same_on_every_rank(torch::nn::Module& model) {
  for (const auto& item : model.named_parameters()) {
    torch::Tensor mine = item.value().detach().clone();
    torch::Tensor rank0 = mine.clone();
    world()->broadcast(rank0, 0);
    EXPECT_TRUE(torch::equal(mine, rank0)) << item.key() << " differs from rank 0's on rank " << get_rank();
  }
}

// One FAIL_MODE, in a world of its own.
void drop_a_failed_step(const std::string& mode) {
  testing::WorkerWorld world_guard;
  const int rank = get_rank(), world_size = get_world_size();
  torch::manual_seed(5);
  auto model = std::make_shared<FailingMlp>(mode, rank == 1 ? kFailStep : -1);
  torch::manual_seed(5);
  auto reference = std::make_shared<testing::DdpMlp>();
  // Small buckets: the failure strikes with some buckets launched and some not.
  auto ddp = std::make_shared<DistributedDataParallel>(
      model, world(), DDPOptions().first_bucket_cap_mb(0.0005).bucket_cap_mb(0.002));
  auto optim = testing::sgd_momentum(*model);
  optim->set_gradient_sync(ddp);
  optim->initialize_count_status(0, kSteps);
  auto reference_optim = testing::sgd_momentum(*reference);
  reference_optim->initialize_count_status(0, kSteps);

  std::vector<std::pair<int64_t, std::string>> errors;
  for (int64_t step = 0; step < kSteps; ++step) {
    Batch batch = testing::global_batch(kPerRank * world_size, static_cast<uint64_t>(700 + step));
    StepContext context{step, {}};
    if (mode == "after" && rank == 1 && step == kFailStep) {
      context.after_backward = [] { throw Error("boom after the reduction"); };
    }
    try {
      model->run_train_step(batch.slice(rank * kPerRank, kPerRank), *optim, context);
    } catch (const std::exception& error) {
      errors.emplace_back(step, error.what());  // a program that owns its loop catches and goes on
    }
    // The reference skips the step every rank dropped.
    if (mode == "after" || step != kFailStep) reference->train_step(batch, *reference_optim);
    if (mode == "after" && !errors.empty() && errors.back().first > kFailStep) break;
  }
  if (mode == "after") {
    // Rank 1's own step fails at once; the next step fails on every rank.
    ASSERT_FALSE(errors.empty());
    const auto& last = errors.back();
    EXPECT_EQ(last.first, kFailStep + 1) << last.second;
    EXPECT_TRUE(contains(last.second, "rank(s) 1 failed after the gradients of an earlier step were reduced"))
        << last.second;
    EXPECT_TRUE(contains(last.second, "cannot be dropped")) << last.second;
    return;
  }
  ASSERT_EQ(errors.size(), 1u) << (errors.empty() ? "no step failed" : errors.back().second);
  EXPECT_EQ(errors[0].first, kFailStep);
  const std::string& message = errors[0].second;
  EXPECT_TRUE(contains(message, "the step of iteration 3 was dropped on every rank: failed on rank 1 of 2"))
      << message;
  const std::string reason = mode == "forward"    ? "boom in forward"
                             : mode == "backward" ? "boom in backward"
                                                  : "received no gradient, so their buckets could not be reduced: fc1.weight";
  EXPECT_TRUE(contains(message, reason)) << message;
  expect_same_on_every_rank(*model);
  // Every later step ran as if the failed one had never been: the same
  // weights as one process that skipped it (up to the summation order).
  testing::expect_same_state(*model, *reference, 1e-5, 1e-6);
}

// Each FAIL_MODE in turn, in one launch: a mode that left a rank waiting in a
// collective would sit out the 30-minute timeout, far beyond 60 s.
LOCKSTEP_WORKER_TEST(FailTogetherWorker, DdpDropsAFailedStepOnEveryRank) {
  for (const char* mode : {"forward", "backward", "unready", "after"}) {
    SCOPED_TRACE(std::string("FAIL_MODE=") + mode);
    const auto start = std::chrono::steady_clock::now();
    drop_a_failed_step(mode);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60);
  }
}

TEST(FailTogether, DdpDropsAStepThatFailedOnOneRankAndEveryRankGoesOn) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::WorkersOptions options;
  options.timeout_s = 4 * 120;
  auto result = testing::run_workers(2, "FailTogetherWorker.DdpDropsAFailedStepOnEveryRank", options);
  EXPECT_WORKERS_OK(result);
  EXPECT_LT(result.seconds, 4 * 60);
}

// x -> Sequential(Linear, Tanh, Linear) -> cross-entropy, two FSDP units.
struct FsdpFailingMlp : Model {
  explicit FsdpFailingMlp(int64_t fail_at_call) : fail_at(fail_at_call) {
    layers = register_module("layers", torch::nn::Sequential(torch::nn::Linear(16, 24), torch::nn::Tanh(),
                                                             torch::nn::Linear(24, 5)));
  }
  LossDict loss(const Batch& data) override {
    torch::Tensor out = layers->forward(data.at("x"));
    if (calls++ == fail_at) {
      out.register_hook([](const torch::Tensor&) -> torch::Tensor { throw Error("boom in backward"); });
    }
    LossDict losses;
    losses.insert("loss", torch::nn::functional::cross_entropy(out, data.at("y")));
    return losses;
  }
  Batch predict(const Batch& data) override { return {{"logits", layers->forward(data.at("x"))}}; }
  torch::nn::Sequential layers{nullptr};
  int64_t fail_at;
  int64_t calls = 0;
};

// FSDP cannot drop a step: the failing rank is told so, also by every later
// step it tries (never an internal error), and leaves; the other rank, inside
// the step's collectives, fails as soon as that process is gone.
LOCKSTEP_WORKER_TEST(FailTogetherWorker, FsdpRefusesToGoOnAfterAFailedStep) {
  testing::WorkerWorld world_guard;
  const int rank = get_rank();
  torch::manual_seed(3);
  auto model = std::make_shared<FsdpFailingMlp>(rank == 1 ? 2 : -1);
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(),
                                                         FSDPOptions().auto_wrap_policy(module_type_wrap_policy({"Linear"})));
  auto optim = std::make_shared<OptimWrapper>(
      std::make_shared<torch::optim::SGD>(fsdp->shard_parameters(), torch::optim::SGDOptions(0.05)));
  optim->set_gradient_sync(fsdp);
  optim->initialize_count_status(0, 10);
  std::string first, second;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < 10 && second.empty(); ++step) {
    Batch batch = testing::global_batch(8, static_cast<uint64_t>(40 + step)).slice(rank * 4, 4);
    try {
      model->run_train_step(batch, *optim, {step, {}});
    } catch (const std::exception& error) {
      (first.empty() ? first : second) = error.what();
      if (rank == 0) break;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rank == 1) {
    EXPECT_TRUE(contains(first, "the step of iteration 2 failed before its gradients were reduced")) << first;
    EXPECT_TRUE(contains(first, "boom in backward")) << first;
    EXPECT_TRUE(contains(first, "A sharded step cannot be dropped on every rank")) << first;
    EXPECT_EQ(second, first) << "a later step must repeat why it cannot run";
  } else {
    EXPECT_FALSE(first.empty()) << "rank 0 trained on alone";
    EXPECT_LT(seconds, 30) << "rank 0 waited " << seconds << " s: " << first;
  }
  // Leave without the orderly teardown: the two ranks' collectives no longer pair.
  std::fflush(nullptr);
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
}

TEST(FailTogether, FsdpSaysAFailedStepCannotBeDroppedAndTheOtherRankEnds) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::WorkersOptions options;
  options.timeout_s = 120;
  auto result = testing::run_workers(2, "FailTogetherWorker.FsdpRefusesToGoOnAfterAFailedStep", options);
  EXPECT_WORKERS_OK(result);
}

// ---- whole runs through the Runner, one rank failing in a collective phase

// Trains the reliability config (2 ranks) in this process. The rank named by
// STAY_ALIVE catches its error and stays alive, as a program that owns its
// loop would, so the others cannot learn of the failure by its exit: until
// every other rank has ended (each leaves a file saying so in RUN_DIR), for
// at most 120 s. A rank that waited for the failed one to exit would end
// after 120 s and fail the parent's bound of 90 s; a fixed 20 s stay (as
// before) both cost those 20 s and let such a rank pass.
LOCKSTEP_WORKER_TEST(FailTogetherWorker, RunnerFailsOnEveryRank) {
  Config config = parse_config(testing::small_job_config(), "small_job.yaml");
  config.apply_override(env_or("STRATEGY", testing::ddp_strategy_line()));
  const std::string work_dir = env_or("RUN_DIR");
  const int stay_alive = std::stoi(env_or("STAY_ALIVE", "-1"));
  const auto start = std::chrono::steady_clock::now();
  std::string message = "<no error>";
  // Outside the try: a program that catches the error keeps its trainer and
  // process groups, so the other ranks cannot learn of it from a closed
  // connection.
  std::unique_ptr<Runner> runner;
  try {
    runner = std::make_unique<Runner>(config, RunnerOptions().work_dir(work_dir).resume(env_or("RESUME") == "1"));
    runner->train();
  } catch (const std::exception& error) {
    message = error.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d ended after %.1f s: %s\n", get_rank(), seconds, message.c_str());
  std::fflush(stdout);
  const auto ended_file = [&](int rank) { return work_dir + "/.rank" + std::to_string(rank) + "_ended"; };
  if (get_rank() == stay_alive) {
    for (int rank = 0; rank < get_world_size(); ++rank) {
      if (rank != stay_alive && !testing::wait_for_file(ended_file(rank), 120)) break;
    }
  } else {
    testing::write_file(ended_file(get_rank()), "");
  }
  std::_Exit(0);  // the parent reads the lines above; skip the teardown of a broken job
}

struct RankEnding {
  double seconds = -1;
  std::string message;
};

// "rank R ended after S s: MESSAGE" lines of the workers' output, by rank.
std::map<int, RankEnding> endings(const std::string& output) {
  std::map<int, RankEnding> found;
  std::regex line(R"(rank (\d+) ended after ([0-9.]+) s: (.*))");
  std::istringstream lines(output);
  std::string text;
  while (std::getline(lines, text)) {
    std::smatch match;
    if (std::regex_search(text, match, line)) {
      found[std::stoi(match[1])] = RankEnding{std::stod(match[2]), match[3]};
    }
  }
  return found;
}

struct PhaseFault {
  std::string name;
  std::vector<std::string> env;  // the fault, and who stays alive
  std::string expected;          // in every rank's message
};

void expect_every_rank_fails_fast(const PhaseFault& fault, const std::string& work_dir) {
  testing::WorkersOptions options;
  options.env = fault.env;
  options.env.push_back("RUN_DIR=" + work_dir);
  options.timeout_s = 180;
  auto result = testing::run_workers(2, "FailTogetherWorker.RunnerFailsOnEveryRank", options);
  auto ended = endings(result.output);
  ASSERT_EQ(ended.size(), 2u) << fault.name << ":\n" << result.output;
  for (const auto& [rank, ending] : ended) {
    EXPECT_TRUE(contains(ending.message, fault.expected)) << fault.name << ", rank " << rank << ": " << ending.message;
    EXPECT_TRUE(contains(ending.message, "lockstep fault injection")) << fault.name << ", rank " << rank;
    // Training itself takes a few seconds (more on a loaded machine); a rank
    // left waiting would sit out the 30-minute timeout.
    EXPECT_LT(ending.seconds, 90) << fault.name << ", rank " << rank << ": " << ending.message;
  }
}

TEST(FailTogether, RankZerosCheckpointWriteFailsOnEveryRankAndKeepsWhatWasSaved) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  expect_every_rank_fails_fast(
      {"rank 0's checkpoint write", {"LOCKSTEP_FAULT_THROW_AT=write:model_0000014.ckpt", "LOCKSTEP_FAULT_RANK=0",
                                     "STAY_ALIVE=0"},
       "saving checkpoint " + dir.path() + "/model_0000014.ckpt: failed on rank 0 of 2"},
      dir.path());
  EXPECT_EQ(testing::read_file(dir.file("last_checkpoint")), "model_0000009.ckpt");
  EXPECT_EQ(verify_checkpoint_file(dir.file("model_0000009.ckpt")), "");
  EXPECT_FALSE(testing::file_exists(dir.file("model_0000014.ckpt")));
}

TEST(FailTogether, OneRanksShardWriteFailsOnEveryRank) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  expect_every_rank_fails_fast(
      {"rank 1's shard write",
       {"STRATEGY=strategy={type: FSDPStrategy, launcher: pytorch, backend: gloo, state_dict_type: sharded}",
        "LOCKSTEP_FAULT_THROW_AT=write:model_0000014.ckpt.rank1-of-2.shard", "LOCKSTEP_FAULT_RANK=1", "STAY_ALIVE=1"},
       "writing the shard of each rank: failed on rank 1 of 2"},
      dir.path());
  EXPECT_EQ(testing::read_file(dir.file("last_checkpoint")), "model_0000009.ckpt");
  EXPECT_FALSE(testing::file_exists(dir.file("model_0000014.ckpt"))) << "a manifest naming a missing shard";
}

// Resuming: rank 0 chooses the checkpoint; when rank 1 cannot read it, every
// rank fails naming the file, the rank and the reason (before, rank 1 fell
// back to an older checkpoint on its own, or hung in a collective). Under
// FSDP the rank that could read its part then gathers the persistent root
// unit again, a collective: only after every rank has agreed that each read
// its part (before, rank 0 sat in that all-gather while rank 1 waited in the
// agreement, both until the timeout).
class FailTogetherResume : public ::testing::TestWithParam<std::string> {};

TEST_P(FailTogetherResume, ARankThatCannotReadTheChosenCheckpointFailsEveryRank) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  const std::string config = testing::write_small_job(dir);
  auto first = testing::run_command(
      testing::launched(2, {}, testing::train_argv(config, dir.path(), {GetParam(), "train_cfg.max_iters=12"})), {},
      180);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(testing::read_file(dir.file("last_checkpoint")), "model_final.ckpt");
  const bool sharded = contains(GetParam(), "state_dict_type: sharded");
  const std::string unreadable = sharded ? "model_final.ckpt.rank1-of-2.shard" : "model_final.ckpt";
  const std::string chosen = dir.file("model_final.ckpt");
  // FSDP's load agrees on its own (Note [An agreement inside an agreement]).
  const std::string fsdp_phase = contains(GetParam(), "FSDP") ? "loading " + chosen + " into each rank's shards: " : "";
  expect_every_rank_fails_fast(
      {"rank 1's read of the resumed checkpoint",
       {"STRATEGY=" + GetParam(), "RESUME=1", "LOCKSTEP_FAULT_THROW_AT=read:" + unreadable, "LOCKSTEP_FAULT_RANK=1",
        "STAY_ALIVE=1"},
       "resume: loading " + chosen + " (chosen by rank 0): " + fsdp_phase + "failed on rank 1 of 2: "},
      dir.path());
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, FailTogetherResume,
    ::testing::Values(testing::ddp_strategy_line(),
                      "strategy={type: FSDPStrategy, launcher: pytorch, backend: gloo, state_dict_type: full}",
                      "strategy={type: FSDPStrategy, launcher: pytorch, backend: gloo, state_dict_type: sharded}"),
    [](const ::testing::TestParamInfo<std::string>& info) {
      return contains(info.param, "DDP") ? std::string("DDP")
                                         : contains(info.param, "sharded") ? std::string("FsdpSharded")
                                                                           : std::string("FsdpFull");
    });

}  // namespace
}  // namespace lockstep
