#include "lockstep/checkpoint/safetensors_tools.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/config/config_test_util.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using config_test::error_of;
using ::testing::HasSubstr;

State run_checkpoint() {
  torch::manual_seed(5);
  State state;
  state.tensors["model/fc.weight"] = torch::randn({3, 4});
  state.tensors["model/fc.bias"] = torch::randn({3}, torch::kFloat64);
  state.tensors["model/bn.num_batches_tracked"] = torch::tensor(17, torch::kLong);
  state.tensors["optim_wrapper/optimizer/state/0/momentum_buffer"] = torch::randn({3, 4});
  state.values["meta"] = {{"iteration", 99}, {"config", "model:\n  type: Net\n"}};
  return state;
}

TEST(SafetensorsHeaderTest, ReadsEntriesWithoutTheData) {
  testing::TempDir dir;
  write_checkpoint_file(dir.file("a.ckpt"), run_checkpoint());
  nlohmann::json header = read_safetensors_header(dir.file("a.ckpt"));
  EXPECT_EQ(header["model/fc.weight"]["dtype"], "F32");
  EXPECT_EQ(header["model/fc.weight"]["shape"], nlohmann::json({3, 4}));
  EXPECT_EQ(header["model/bn.num_batches_tracked"]["shape"], nlohmann::json::array());
  EXPECT_TRUE(is_lockstep_checkpoint(header));
  write_safetensors_file(dir.file("b.safetensors"), {{"w", torch::zeros({2})}}, {{"format", "pt"}});
  EXPECT_FALSE(is_lockstep_checkpoint(read_safetensors_header(dir.file("b.safetensors"))));
}

TEST(SafetensorsHeaderTest, BadFilesAreNamed) {
  testing::TempDir dir;
  EXPECT_THAT(error_of([&] { read_safetensors_header(dir.file("missing")); }), HasSubstr("missing: no such file"));
  testing::write_file(dir.file("short"), "1234");
  EXPECT_THAT(error_of([&] { read_safetensors_header(dir.file("short")); }), HasSubstr("short: not a safetensors file"));
  // A header length far past the end of the file.
  testing::write_file(dir.file("long"), std::string("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10));
  EXPECT_THAT(error_of([&] { read_safetensors_header(dir.file("long")); }), HasSubstr("claims 255 bytes"));
  testing::write_file(dir.file("json"), std::string("\x02\x00\x00\x00\x00\x00\x00\x00{]", 10));
  EXPECT_THAT(error_of([&] { read_safetensors_header(dir.file("json")); }), HasSubstr("json: corrupt safetensors header"));
  // One reader serves the header and the whole-file readers: the same words.
  for (const char* name : {"missing", "short", "long", "json"}) {
    const std::string header_error = error_of([&] { read_safetensors_header(dir.file(name)); });
    EXPECT_EQ(error_of([&] { read_safetensors_file(dir.file(name)); }), header_error);
    EXPECT_EQ(error_of([&] { read_checkpoint_file(dir.file(name)); }), header_error);
  }
}

TEST(ExportSafetensorsTest, ModelWeightsOnlyUnderTheModelsNames) {
  testing::TempDir dir;
  State state = run_checkpoint();
  write_checkpoint_file(dir.file("run.ckpt"), state);
  EXPECT_EQ(export_weights(dir.file("run.ckpt"), dir.file("out.safetensors")), 3u);
  SafetensorsContent exported = read_safetensors_file(dir.file("out.safetensors"));
  ASSERT_EQ(exported.tensors.size(), 3u);
  for (const char* name : {"fc.weight", "fc.bias", "bn.num_batches_tracked"}) {
    const torch::Tensor& original = state.tensors.at(std::string("model/") + name);
    ASSERT_EQ(exported.tensors.count(name), 1u) << name;
    EXPECT_EQ(exported.tensors.at(name).scalar_type(), original.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(exported.tensors.at(name), original)) << name;
  }
  EXPECT_EQ(exported.metadata.at("format"), "pt");
  EXPECT_EQ(exported.metadata.at("lockstep.iteration"), "99");
  EXPECT_EQ(exported.metadata.at("lockstep.source"), "run.ckpt");
  EXPECT_EQ(exported.metadata.at("lockstep.config"), "model:\n  type: Net\n");
}

TEST(ExportSafetensorsTest, CastsFloatingTensorsOnly) {
  testing::TempDir dir;
  State state = run_checkpoint();
  write_checkpoint_file(dir.file("run.ckpt"), state);
  export_weights(dir.file("run.ckpt"), dir.file("half.safetensors"), ExportOptions().dtype(torch::kFloat16));
  SafetensorsContent exported = read_safetensors_file(dir.file("half.safetensors"));
  EXPECT_EQ(exported.tensors.at("fc.weight").scalar_type(), torch::kFloat16);
  EXPECT_EQ(exported.tensors.at("fc.bias").scalar_type(), torch::kFloat16);
  EXPECT_EQ(exported.tensors.at("bn.num_batches_tracked").scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(exported.tensors.at("fc.weight"), state.tensors.at("model/fc.weight").to(torch::kFloat16)));
  EXPECT_THAT(error_of([&] {
                export_weights(dir.file("run.ckpt"), dir.file("x.safetensors"), ExportOptions().dtype(torch::kInt));
              }),
              HasSubstr("floating-point"));
}

TEST(ExportSafetensorsTest, CorruptCheckpointIsNamedAndNothingIsWritten) {
  testing::TempDir dir;
  write_checkpoint_file(dir.file("run.ckpt"), run_checkpoint());
  std::string bytes = testing::read_file(dir.file("run.ckpt"));
  bytes[bytes.size() - 3] ^= 0x10;  // inside the last tensor's data
  testing::write_file(dir.file("run.ckpt"), bytes);
  std::string message = error_of([&] { export_weights(dir.file("run.ckpt"), dir.file("out.safetensors")); });
  EXPECT_THAT(message, HasSubstr(dir.file("run.ckpt")));
  EXPECT_THAT(message, HasSubstr("checksum"));
  EXPECT_FALSE(testing::file_exists(dir.file("out.safetensors")));
}

}  // namespace
}  // namespace lockstep
