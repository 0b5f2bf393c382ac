// A small job that many multi-process tests train (reliability, cluster, e2e):
// an MLP on synthetic images, and the commands that run it with `lockstep
// train` under `lockstep run`, and their checkpoints compared bit for bit.
// One job, so that a fix to it lands once; a test changes what it needs with
// --set (`ddp_strategy_line()` makes it DDP).
//
//   const std::string config = testing::write_small_job(dir);
//   auto result = testing::run_command(
//       testing::launched(2, {}, testing::train_argv(config, dir.file("work"), {testing::ddp_strategy_line()})));
//   EXPECT_TRUE(testing::bitwise_equal(testing::checkpoint_weights(a), testing::checkpoint_weights(b)));
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "tests/support/test_support.h"

namespace lockstep::testing {

// The job's YAML, from small_job.yaml beside this file.
inline std::string small_job_config() { return read_file(source_dir() + "/tests/support/small_job.yaml"); }

inline const char* ddp_strategy_line() { return "strategy={type: DDPStrategy, launcher: pytorch, backend: gloo}"; }

// Writes the config into `dir` and returns its path.
inline std::string write_small_job(const TempDir& dir) {
  const std::string path = dir.file("small_job.yaml");
  write_file(path, small_job_config());
  return path;
}

// argv of `lockstep train <config> --work-dir <work_dir> --set ...`.
inline std::vector<std::string> train_argv(const std::string& config, const std::string& work_dir,
                                           const std::vector<std::string>& sets = {}) {
  std::vector<std::string> argv{lockstep_binary(), "train", config, "--work-dir", work_dir};
  for (const auto& assignment : sets) argv.insert(argv.end(), {"--set", assignment});
  return argv;
}

// The same command under `lockstep run --standalone --nproc-per-node N`.
inline std::vector<std::string> launched(int nproc, const std::vector<std::string>& launcher_args,
                                         const std::vector<std::string>& command) {
  std::vector<std::string> argv{lockstep_binary(), "run", "--standalone", "--nproc-per-node", std::to_string(nproc)};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

inline std::map<std::string, torch::Tensor> checkpoint_weights(const std::string& path) {
  return read_checkpoint_file(path).get("model").tensors;
}

inline ::testing::AssertionResult bitwise_equal(const std::map<std::string, torch::Tensor>& a,
                                                const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " tensors";
  for (const auto& [name, tensor] : a) {
    auto other = b.find(name);
    if (other == b.end()) return ::testing::AssertionFailure() << name << " missing";
    if (!torch::equal(tensor, other->second)) return ::testing::AssertionFailure() << name << " differs";
  }
  return ::testing::AssertionSuccess();
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace lockstep::testing
