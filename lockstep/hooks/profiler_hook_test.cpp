// ProfilerHook: the trace of the chosen iterations parses as JSON (Chrome's
// trace format) and holds lockstep's named ranges and the operators inside.
#include "lockstep/hooks/profiler_hook.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "lockstep/core/read_file.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hooks_test_util.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

TEST(ProfilerHook, WritesAChromeTraceWithTheNamedRanges) {
  testing::TrainerRig rig(testing::tiny_mlp(4, 8), /*examples=*/32, /*side=*/4);
  Trainer& trainer = *rig.trainer;
  testing::TempDir dir;
  auto hook = std::make_shared<ProfilerHook>(dir.file("profiler/trace_rank0.json"), /*begin=*/2, /*end=*/4,
                                             /*record_shapes=*/true);
  trainer.register_hooks({hook});
  trainer.train(0, 6);
  const auto trace = nlohmann::json::parse(read_file(dir.file("profiler/trace_rank0.json")));
  ASSERT_TRUE(trace.is_array() || trace.is_object());
  const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
  std::map<std::string, int> counts;
  for (const auto& event : events) {
    if (event.contains("name")) ++counts[event["name"].get<std::string>()];
  }
  // Two iterations profiled: each named range twice.
  for (const char* range : {"lockstep::data", "lockstep::forward", "lockstep::backward", "lockstep::optimizer_step"}) {
    EXPECT_EQ(counts[range], 2) << range;
  }
  EXPECT_GT(counts["aten::addmm"] + counts["aten::linear"] + counts["aten::mm"], 0) << "operators inside the ranges";
  for (const auto& event : events) {
    if (event.value("name", "") == "lockstep::forward") {
      EXPECT_EQ(event.value("ph", ""), "X");
      EXPECT_GT(event.value("dur", 0.0), 0.0);
    }
  }
}

}  // namespace
}  // namespace lockstep
