// ProfilerHook through `lockstep train --nproc 2`: one Chrome trace per rank
// under <work_dir>/profiler/, each with the named ranges, the wait for DDP's
// gradient reductions included.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/support/test_support.h"

namespace lockstep {
namespace {

TEST(ProfilerRun, OneTracePerRankWithTheNamedRanges) {
  testing::TempDir dir;
  auto run = testing::run_command(
      {testing::lockstep_binary(), "train", testing::source_dir() + "/examples/fashion_mnist/cnn_ddp.yaml", "--nproc",
       "2", "--work-dir", dir.file("run"),
       "--set", "train_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 256, seed: 1}",
       "--set", "val_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 64, seed: 2}",
       "--set", "test_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 64, seed: 2}",
       "--set", "train_cfg={_delete_: true, max_iters: 6, val_interval: 6}", "--set", "param_scheduler=[]",
       "--set", "custom_hooks=[{type: ProfilerHook, begin: 2, end: 5, record_shapes: true}]"},
      {}, 300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = dir.file("run/profiler/trace_rank" + std::to_string(rank) + ".json");
    ASSERT_TRUE(testing::file_exists(path)) << path;
    const auto trace = nlohmann::json::parse(testing::read_file(path));
    const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
    std::map<std::string, int> counts;
    for (const auto& event : events) {
      if (event.contains("name")) ++counts[event["name"].get<std::string>()];
    }
    for (const char* range : {"lockstep::data", "lockstep::forward", "lockstep::backward",
                              "lockstep::wait_for_communication", "lockstep::optimizer_step"}) {
      EXPECT_EQ(counts[range], 3) << "rank " << rank << ": " << range;
    }
  }
}

}  // namespace
}  // namespace lockstep
