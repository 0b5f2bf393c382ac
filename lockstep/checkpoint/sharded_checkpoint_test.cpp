#include "lockstep/checkpoint/sharded_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/core/error.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using nlohmann::json;

// A sharded checkpoint as FSDPStrategy writes one, by hand: one unit (the
// root) of 5 elements -- "a" [2] at 0, "b" [3] at 2, "tied" another name of
// "a" -- in 2 shards of 3 (the last element padding), plus a buffer saved in
// bf16 whose own dtype is float.
json layout_of_test_model(bool with_names = true) {
  json unit = {{"path", ""}, {"numel", 5}, {"padded_numel", 6}, {"dtype", "Float"},
               {"params", json::array({json::array({"a", {2}, 0}), json::array({"b", {3}, 2})})}};
  json layout = {{"world_size", 2}, {"shard_world_size", 2}, {"sharding_strategy", "FULL_SHARD"},
                 {"use_orig_params", false}, {"units", json::array({unit})}};
  if (with_names) {
    layout["units"][0]["aliases"] = {{"tied", "a"}};
    layout["buffer_dtypes"] = {{"norm.mean", static_cast<int>(torch::kFloat32)}};
  }
  return layout;
}

std::string write_test_checkpoint(const testing::TempDir& dir, const json& layout) {
  const std::string manifest = dir.file("model_0000009.ckpt");
  const torch::Tensor layout_values = torch::tensor({10.f, 11.f, 20.f, 21.f, 22.f, 0.f});
  for (int rank = 0; rank < 2; ++rank) {
    CheckpointShard shard;
    shard.rank = rank;
    shard.world_size = 2;
    shard.model.tensors["shards/flat_param"] = layout_values.narrow(0, 3 * rank, 3).clone();
    shard.model.tensors["buffers/norm.mean"] = torch::tensor({0.5f, 0.25f}).to(torch::kBFloat16);
    shard.model.values = {{"layout", layout}, {"shard_rank", rank}};
    write_shard(manifest, shard);
  }
  CheckpointContents contents;
  contents.sharding = json{{"world_size", 2}, {"with_optimizer", false}, {"layout", layout}};
  write_checkpoint(manifest, contents);
  return manifest;
}

TEST(ShardedCheckpointTest, WholeWeightsAreCutFromTheShardsWithTheirNamesAndDtypes) {
  testing::TempDir dir;
  const std::string manifest = write_test_checkpoint(dir, layout_of_test_model());
  auto weights = whole_model_weights(read_checkpoint(manifest), manifest);
  ASSERT_EQ(weights.size(), 4u);
  EXPECT_TRUE(torch::equal(weights.at("a"), torch::tensor({10.f, 11.f})));
  EXPECT_TRUE(torch::equal(weights.at("b"), torch::tensor({20.f, 21.f, 22.f})));  // across both shards
  EXPECT_TRUE(torch::equal(weights.at("tied"), weights.at("a")));
  EXPECT_EQ(weights.at("norm.mean").scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(weights.at("norm.mean"), torch::tensor({0.5f, 0.25f})));
}

// The error gathering the whole weights of `manifest` gives ("" if none).
std::string export_error(const std::string& manifest) {
  try {
    whole_model_weights(read_checkpoint(manifest), manifest);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(ShardedCheckpointTest, AnOlderLayoutWithoutNamesIsRefusedNotExportedShort) {
  testing::TempDir dir;
  const std::string manifest = write_test_checkpoint(dir, layout_of_test_model(/*with_names=*/false));
  const std::string error = export_error(manifest);
  EXPECT_NE(error.find("did not record tied parameter names"), std::string::npos) << error;
  EXPECT_NE(error.find("model_0000009.ckpt"), std::string::npos) << error;
}

TEST(ShardedCheckpointTest, AMissingShardFileIsNamed) {
  testing::TempDir dir;
  const std::string manifest = write_test_checkpoint(dir, layout_of_test_model());
  std::filesystem::remove(shard_path(manifest, 1, 2));
  const std::string error = export_error(manifest);
  EXPECT_NE(error.find("model_0000009.ckpt.rank1-of-2.shard"), std::string::npos) << error;
}

TEST(ShardedCheckpointTest, RemovingACheckpointRemovesItsShardsAndNoOther) {
  testing::TempDir dir;
  const std::string manifest = write_test_checkpoint(dir, layout_of_test_model());
  testing::write_file(dir.file("model_00000099.ckpt.rank0-of-2.shard"), "another checkpoint's");
  remove_checkpoint(manifest);
  EXPECT_FALSE(testing::file_exists(manifest));
  EXPECT_FALSE(testing::file_exists(shard_path(manifest, 0, 2)));
  EXPECT_FALSE(testing::file_exists(shard_path(manifest, 1, 2)));
  EXPECT_TRUE(testing::file_exists(dir.file("model_00000099.ckpt.rank0-of-2.shard")));
}

}  // namespace
}  // namespace lockstep
