// `lockstep train`'s DCP checkpoints (state_dict_type: dcp, FullyShard's
// `sharded`) against PyTorch 2.14's own fully_shard runs, both ways:
//  - a 2-rank FullyShard run with AdamW saves the same tensors, bit for bit,
//    as PyTorch's run of the same case saves with dcp.save({"model":
//    get_model_state_dict, "optim": get_optimizer_state_dict}); and PyTorch's
//    dcp.load reads lockstep's directory at 1 and at 3 ranks (fully_shard)
//    into a model and optimizer whose whole state equals it bitwise, with
//    the optimizer's options;
//  - PyTorch saves after 5 steps at 3 ranks; lockstep resumes from that
//    directory at 2 ranks (`resume: true`, `load_from: <dir>`) and its next
//    20 steps give the weights PyTorch's own continuation at 2 ranks gives;
//    and lockstep's DDP, as PyTorch's DDP, resumes from it too.
//
// Needs PyTorch 2.14 at python3 (CI's libtorch 2.14 leg): fully_shard's
// reference is 2.14 (tests/differential/differential_cases.cpp); skips
// elsewhere, saying so. Cost: about 10 Python runs of some seconds each.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/checkpoint/pt_file.h"
#include "tests/differential/differential_cases.h"
#include "tests/differential/differential_config.h"
#include "tests/support/same_tensors.h"
#include "tests/support/test_support.h"

namespace lockstep {
// Named: the unity build joins this file with the suite's others.
namespace dcp_train_test {
namespace {

using nlohmann::json;

std::string reference_script() { return testing::source_dir() + "/tests/differential/pytorch_reference.py"; }

// Why the tests cannot run here, or "" where they can.
std::string why_skipped() {
  return testing::python_torch_lacks(
      "import sys, torch\nsys.exit(tuple(int(p) for p in torch.__version__.split('.')[:2]) < (2, 14))",
      "is older than 2.14, fully_shard's reference here (CI's 2.14 leg runs these)");
}

const differential::DiffCase& find_case(const std::string& name) {
  for (const auto& c : differential::all_cases()) {
    if (c.name == name) return c;
  }
  throw std::runtime_error("no differential case " + name);
}

// FullyShard at 2 ranks, with AdamW: its state (exp_avg, exp_avg_sq, step) is what DCP must carry.
json adamw_case(int iters) {
  json c = find_case("FullyShard_2ranks").reference;
  c["optimizer"] = find_case("FullyShard_AdamW_Accumulation_3ranks").reference["optimizer"];
  c["iters"] = iters;
  return c;
}

std::string dcp_strategy() { return find_case("FullyShard_2ranks").strategy + "  state_dict_type: sharded\n"; }

// pytorch_reference.py ARGS..., which must succeed.
void reference(const std::vector<std::string>& args) {
  std::vector<std::string> argv{testing::python(), reference_script()};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto run = testing::run_command(argv, {"OMP_NUM_THREADS=1"}, 480);
  ASSERT_EQ(run.exit_code, 0) << run.output;
}
// `c` as `dir`/NAME.json, for the reference script.
std::string case_file(const testing::TempDir& dir, const std::string& name, const json& c) {
  testing::write_file(dir.file(name + ".json"), c.dump());
  return dir.file(name + ".json");
}

// `lockstep train` of `c` from `init` with `strategy` (and `more` YAML), in `dir`/work.
void lockstep_train(const testing::TempDir& dir, const json& c, const std::string& strategy, const std::string& init,
                    const std::string& more = "") {
  const std::string config = dir.file("case.yaml");
  testing::write_file(config, differential::lockstep_config(c, differential::pinned_to_cpu(strategy), init) + more);
  const auto run = testing::run_command({testing::lockstep_binary(), "train", config, "--work-dir", dir.file("work"),
                                         "--nproc", std::to_string(c["world"].get<int>())},
                                        {}, 600);
  ASSERT_EQ(run.exit_code, 0) << run.output;
}

// lockstep's final weights (`dir`/work) against PyTorch's (`dir`/pytorch.safetensors): bitwise, `why`.
void expect_final_weights_bitwise(const testing::TempDir& dir, const std::string& why) {
  const auto exported = testing::export_checkpoint(dir.file("work/model_final.ckpt"), dir.file("lockstep.safetensors"));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const auto compared = testing::run_command(
      {testing::python(), reference_script(), "compare", dir.file("lockstep.safetensors"), dir.file("pytorch.safetensors")});
  ASSERT_EQ(compared.exit_code, 0) << compared.output;
  std::cout << "relative differences: " << compared.output;
  const json differences = json::parse(compared.output);
  double worst = 0;
  for (const auto& item : differences.items()) worst = std::max(worst, item.value().get<double>());
  std::cout << "largest: " << worst << "\n";
  EXPECT_EQ(worst, 0.0) << why;
}

TEST(DcpTrain, LockstepSavesWhatPyTorchSavesAndDcpLoadReadsItAtOneAndThreeRanks) {
  if (!why_skipped().empty()) GTEST_SKIP() << why_skipped();
  testing::TempDir dir;
  const json c = adamw_case(8);
  reference({"init", case_file(dir, "case", c), dir.file("init.safetensors")});
  json saving = c;
  saving["dcp_save"] = dir.file("pytorch.dcp");
  reference({"train", case_file(dir, "saving", saving), dir.file("init.safetensors"), dir.file("pytorch.safetensors")});
  lockstep_train(dir, c, dcp_strategy(), dir.file("init.safetensors"));
  const std::string mine = dir.file("work/model_final.dcp");
  ASSERT_TRUE(is_dcp_checkpoint(mine));
  const auto saved = read_dcp_state_dict(mine);
  // The same names (model.<fqn>, optim.state.<fqn>.<buffer>), dtypes, shapes and bits as PyTorch's own.
  EXPECT_TRUE(testing::same_tensors(saved, read_dcp_state_dict(dir.file("pytorch.dcp"))));
  EXPECT_TRUE(saved.count("optim.state.head.3.weight.exp_avg_sq") && saved.count("optim.state.features.0.bias.step"));
  for (int world : {1, 3}) {
    SCOPED_TRACE("dcp.load at " + std::to_string(world) + " rank(s)");
    const std::string loaded = dir.file("loaded" + std::to_string(world) + ".pt");
    reference({"dcp_load", dir.file("case.json"), std::to_string(world), mine, loaded});
    EXPECT_TRUE(testing::same_tensors(read_pt_state_dict(loaded), saved));
    const json groups = json::parse(testing::read_file(loaded + ".json"));
    ASSERT_EQ(groups.size(), 1u);
    for (const char* key : {"lr", "weight_decay", "eps"}) {
      EXPECT_EQ(groups[0][key].get<double>(), c["optimizer"][key].get<double>()) << key;
    }
    EXPECT_EQ(groups[0]["betas"], c["optimizer"]["betas"]);
    EXPECT_EQ(groups[0]["decoupled_weight_decay"], true);
    EXPECT_EQ(groups[0]["params"].size(), 8u) << groups.dump();
  }
}

TEST(DcpTrain, APyTorchCheckpointOfThreeRanksResumesOnTwoAsPyTorchContinues) {
  if (!why_skipped().empty()) GTEST_SKIP() << why_skipped();
  testing::TempDir dir;
  const json c = adamw_case(25);
  reference({"init", case_file(dir, "case", c), dir.file("init.safetensors")});
  json first = c;  // 5 steps at 3 ranks, saved
  first["world"] = 3;
  first["iters"] = 5;
  first["dcp_save"] = dir.file("pytorch3.dcp");
  reference({"train", case_file(dir, "first", first), dir.file("init.safetensors"), dir.file("first.safetensors")});
  json rest = c;  // PyTorch's own continuation at 2 ranks
  rest["start_iter"] = 5;
  rest["dcp_load"] = dir.file("pytorch3.dcp");
  reference({"train", case_file(dir, "rest", rest), dir.file("init.safetensors"), dir.file("pytorch.safetensors")});
  lockstep_train(dir, c, find_case("FullyShard_2ranks").strategy, dir.file("pytorch3.dcp"), "resume: true\n");
  expect_final_weights_bitwise(dir, "2-rank FullyShard is bitwise with fully_shard (differential_cases.cpp)");
}

// DCP's point is that any parallelism reads it: PyTorch's FullyShard run
// saves after 5 steps at 3 ranks, PyTorch's DDP run at 2 ranks dcp.loads it
// and carries on, and lockstep's DDP resumes from the same directory at 2
// ranks (Note [A whole model from DCP]) to the same weights.
TEST(DcpTrain, APyTorchFullyShardCheckpointResumesUnderDdpAsPyTorchsDdpContinues) {
  if (!why_skipped().empty()) GTEST_SKIP() << why_skipped();
  testing::TempDir dir;
  const json c = adamw_case(25);
  reference({"init", case_file(dir, "case", c), dir.file("init.safetensors")});
  json first = c;  // 5 steps of FullyShard at 3 ranks, saved
  first["world"] = 3;
  first["iters"] = 5;
  first["dcp_save"] = dir.file("pytorch3.dcp");
  reference({"train", case_file(dir, "first", first), dir.file("init.safetensors"), dir.file("first.safetensors")});
  json rest = c;  // PyTorch's DDP from it at 2 ranks
  rest.erase("fully_shard");
  rest["start_iter"] = 5;
  rest["dcp_load"] = dir.file("pytorch3.dcp");
  reference({"train", case_file(dir, "rest", rest), dir.file("init.safetensors"), dir.file("pytorch.safetensors")});
  json ddp = c;
  ddp.erase("fully_shard");
  lockstep_train(dir, ddp, find_case("DDP_2ranks").strategy, dir.file("pytorch3.dcp"), "resume: true\n");
  expect_final_weights_bitwise(dir, "2-rank DDP with AdamW is bitwise with PyTorch's (differential_cases.cpp)");
}

}  // namespace
}  // namespace dcp_train_test
}  // namespace lockstep
