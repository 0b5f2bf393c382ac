// lockstep's torch.distributed.checkpoint (DCP) files against PyTorch's own
// dcp.save and dcp.load (dcp_reference.py), in one process and in three
// sharded with FSDP2's fully_shard (uneven rows, one rank holding an empty
// shard): lockstep reads what dcp.save wrote as the whole state dict, and
// dcp.load reads what lockstep wrote into the model, both bitwise equal to
// the state dict the script torch.saves.
//
// Needs a PyTorch with DCP and FSDP2 (2.6 and later): CI's libtorch 2.14 leg
// runs it, as part of the differential area; with Debian bookworm's 1.13
// every test skips. Cost: six Python runs, about 8 s each on 2 cores.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/checkpoint/pt_file.h"
#include "tests/support/same_tensors.h"
#include "tests/support/test_support.h"

namespace lockstep {
// Named: the unity build joins this file with differential_test.cpp.
namespace dcp_pytorch_test {
namespace {

std::string reference_script() { return testing::source_dir() + "/tests/differential/dcp_reference.py"; }

// Why the tests cannot run here, or "" where they can: dcp_reference.py exits 3 without DCP and fully_shard.
std::string why_skipped() {
  return testing::python_torch_lacks(
      "import torch.distributed.checkpoint, torch.distributed.tensor\nfrom torch.distributed.fsdp import fully_shard",
      "has no torch.distributed.checkpoint with FSDP2's fully_shard (PyTorch 2.6 or later; CI's 2.14 leg has it)");
}

// dcp_reference.py ACTION WORLD ARGS..., which must succeed.
void reference(const std::string& action, int world, const std::vector<std::string>& args) {
  std::vector<std::string> argv{testing::python(), reference_script(), action, std::to_string(world)};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto run = testing::run_command(argv, {"OMP_NUM_THREADS=1"}, 300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
}

class DcpPytorch : public ::testing::TestWithParam<int> {};

TEST_P(DcpPytorch, LockstepReadsWhatDcpSaveWrote) {
  if (!why_skipped().empty()) GTEST_SKIP() << why_skipped();
  const int world = GetParam();
  testing::TempDir dir;
  reference("save", world, {dir.path()});
  if (world > 1) EXPECT_TRUE(std::filesystem::exists(dir.file("dcp/__" + std::to_string(world - 1) + "_0.distcp")));
  EXPECT_TRUE(testing::same_tensors(read_dcp_state_dict(dir.file("dcp")), read_pt_state_dict(dir.file("full.pt"))));
  // The user's path: `lockstep ckpt export` (and load_from, which reads
  // through the same read_model_weights) takes the DCP directory as it is.
  const auto exported = testing::run_command(
      {testing::lockstep_binary(), "ckpt", "export", dir.file("dcp"), "-o", dir.file("from_dcp.safetensors")});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(testing::same_tensors(read_safetensors_file(dir.file("from_dcp.safetensors")).tensors,
                       read_pt_state_dict(dir.file("full.pt"))));
}

TEST_P(DcpPytorch, DcpLoadReadsWhatLockstepWrote) {
  if (!why_skipped().empty()) GTEST_SKIP() << why_skipped();
  const int world = GetParam();
  testing::TempDir dir;
  reference("save", 1, {dir.path()});  // the model's state dict, as full.pt
  write_dcp_state_dict(read_pt_state_dict(dir.file("full.pt")), dir.file("lockstep_dcp"));
  reference("load", world, {dir.file("lockstep_dcp"), dir.file("full.pt")});
}

INSTANTIATE_TEST_SUITE_P(Ranks, DcpPytorch, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& info) { return "World" + std::to_string(info.param); });

}  // namespace
}  // namespace dcp_pytorch_test
}  // namespace lockstep
