// FSDPStrategy's config: which checkpoint format each state_dict_type means
// under each wrapper, async_save's requirement, and FullyShard's keys
// (fully_shard's own names, plus FSDP's prefetch and overlap switches).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lockstep/config/config.h"
#include "lockstep/strategy/fsdp_strategy.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

FSDPStrategyOptions parse(const std::string& yaml) { return parse_fsdp_strategy_options(parse_config(yaml, "run.yaml")); }

TEST(FSDPStrategyOptions, DcpCheckpointsNeedEachParametersOwnOptimizerState) {
  EXPECT_EQ(parse("type: FSDPStrategy\nstate_dict_type: dcp\nmodel_wrapper: {use_orig_params: true}\n").state_dict_type,
            StateDictType::kDcp);
  // fully_shard's sharded state dicts are DTensors, which PyTorch saves with DCP.
  EXPECT_EQ(parse("type: FSDPStrategy\nstate_dict_type: sharded\nmodel_wrapper: {type: FullyShard}\n").state_dict_type,
            StateDictType::kDcp);
  EXPECT_EQ(parse("type: FSDPStrategy\nstate_dict_type: sharded\n").state_dict_type, StateDictType::kSharded);
  EXPECT_THAT(testing::error_of([] { parse("type: FSDPStrategy\nstate_dict_type: dcp\n"); }),
              AllOf(HasSubstr("run.yaml:2"), HasSubstr("needs model_wrapper.use_orig_params: true")));
}

TEST(FSDPStrategyOptions, AsyncSaveWritesDcpOnly) {
  const auto options =
      parse("type: FSDPStrategy\nstate_dict_type: sharded\nasync_save: true\nmodel_wrapper: {type: FullyShard}\n");
  EXPECT_TRUE(options.async_save);
  EXPECT_THAT(testing::error_of([] { parse("type: FSDPStrategy\nstate_dict_type: full\nasync_save: true\n"); }),
              AllOf(HasSubstr("run.yaml:3"), HasSubstr("it needs state_dict_type: dcp")));
}

TEST(FSDPStrategyOptions, FullyShardReadsItsPrefetchAndOverlapSwitches) {
  const auto lean = parse(
      "type: FSDPStrategy\nmodel_wrapper:\n  type: FullyShard\n  backward_prefetch: none\n  overlap_reductions: false\n");
  EXPECT_TRUE(lean.fsdp.per_parameter_sharding());
  EXPECT_EQ(lean.fsdp.backward_prefetch(), BackwardPrefetch::kNone);
  EXPECT_FALSE(lean.fsdp.overlap_reductions());
  const auto defaults = parse("type: FSDPStrategy\nmodel_wrapper: {type: FullyShard}\n");
  EXPECT_EQ(defaults.fsdp.backward_prefetch(), BackwardPrefetch::kPre);
  EXPECT_TRUE(defaults.fsdp.overlap_reductions());
  EXPECT_THAT(testing::error_of([] {
                parse("type: FSDPStrategy\nmodel_wrapper: {type: FullyShard, backward_prefetch: early}\n");
              }),
              HasSubstr("backward_prefetch must be 'pre', 'post' or 'none', got 'early'"));
}

}  // namespace
}  // namespace lockstep
