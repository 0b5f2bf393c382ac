// `lockstep ckpt inspect|export` and load_from with pretrained safetensors,
// checked through the command line and against an independent safetensors
// reader and writer (tests/tools/safetensors_io.py: struct, json and numpy,
// nothing of lockstep's).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/pretrained.h"
#include "lockstep/strategy/load_pretrained.h"
#include "lockstep/builtin_models/classifiers.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// MLP 16 -> 8 -> 4: parameters layers.1.{weight [8, 16], bias [8]} and layers.3.{weight [4, 8], bias [4]}.
// `lr` is a knob: 1e-30 makes an update smaller than half an ulp of any
// weight the tests load (none is near zero), so the final checkpoint holds
// exactly the weights the run started from.
std::string run_config(const std::string& lr, const std::string& extra = "") {
  return testing::read_file(testing::source_dir() + "/tests/tools/ckpt_run.yaml") +
         "optim_wrapper: {optimizer: {type: SGD, lr: " + lr + "}}\n" + extra;
}

testing::CommandResult lockstep_cli(std::vector<std::string> args) {
  args.insert(args.begin(), testing::lockstep_binary());
  return testing::run_command(args, {}, 300);
}

testing::CommandResult train(const testing::TempDir& dir, const std::string& name, const std::string& config,
                             std::vector<std::string> extra = {}) {
  testing::write_file(dir.file(name + ".yaml"), config);
  std::vector<std::string> args{"train", dir.file(name + ".yaml"), "--work-dir", dir.file(name)};
  args.insert(args.end(), extra.begin(), extra.end());
  return lockstep_cli(args);
}

std::string safetensors_io() { return testing::source_dir() + "/tests/tools/safetensors_io.py"; }

nlohmann::json python_read(const std::string& path) {
  auto result = testing::run_command({testing::python(), safetensors_io(), "read", path});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return nlohmann::json::parse(result.output);
}

void python_write(const std::string& path, const nlohmann::json& spec) {
  testing::write_file(path + ".json", spec.dump());
  auto result = testing::run_command({testing::python(), safetensors_io(), "write", path, path + ".json"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

std::vector<double> values_of(const torch::Tensor& tensor) {
  torch::Tensor flat = tensor.to(torch::kFloat64).contiguous().flatten();
  return std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
}

// 0.01 * (start + 1), 0.01 * (start + 2), ...: no zero, so a 1e-30 step leaves them bitwise unchanged.
std::vector<double> ramp(int64_t count, double start) {
  std::vector<double> values;
  for (int64_t i = 0; i < count; ++i) values.push_back(0.01 * static_cast<double>(start + i + 1));
  return values;
}

torch::Tensor tensor_of(const std::vector<double>& values, std::vector<int64_t> shape, torch::ScalarType dtype) {
  return torch::tensor(values, torch::kFloat64).reshape(shape).to(dtype);
}

// ---- --help -----------------------------------------------------------------

// The subcommands a help text lists under "Subcommands:".
std::vector<std::string> subcommands_in(const std::string& help) {
  std::vector<std::string> names;
  std::istringstream lines(help.substr(std::min(help.size(), help.find("Subcommands:"))));
  std::string line;
  std::getline(lines, line);
  std::smatch match;
  while (std::getline(lines, line) && std::regex_search(line, match, std::regex("^  ([a-z][a-z0-9_-]*)(\\s|$)"))) {
    names.push_back(match[1]);
  }
  return names;
}

TEST(CliHelpTest, EverySubcommandAnswersHelp) {
  std::set<std::string> seen;
  std::vector<std::vector<std::string>> pending{{}};
  while (!pending.empty()) {
    std::vector<std::string> path = pending.back();
    pending.pop_back();
    std::vector<std::string> args = path;
    args.push_back("--help");
    auto result = lockstep_cli(args);
    std::string joined;
    for (const auto& part : path) joined += (joined.empty() ? "" : " ") + part;
    EXPECT_EQ(result.exit_code, 0) << "lockstep " << joined << " --help:\n" << result.output;
    EXPECT_THAT(result.output, HasSubstr("Usage:")) << joined;
    seen.insert(joined);
    for (const auto& name : subcommands_in(result.output)) {
      auto child = path;
      child.push_back(name);
      pending.push_back(child);
    }
  }
  for (const char* expected : {"", "train", "run", "ckpt", "ckpt inspect", "ckpt export", "plot"}) {
    EXPECT_EQ(seen.count(expected), 1u) << "no help reached for '" << expected << "'";
  }
}

// ---- inspect ----------------------------------------------------------------

TEST(CkptInspectTest, ShowsIterationTensorsAndConfigAndNamesACorruptTensor) {
  testing::TempDir dir;
  auto trained = train(dir, "run", run_config("0.05"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string checkpoint = dir.file("run/model_final.ckpt");

  auto inspected = lockstep_cli({"ckpt", "inspect", checkpoint, "--json"});
  ASSERT_EQ(inspected.exit_code, 0) << inspected.output;
  auto info = nlohmann::json::parse(inspected.output);
  EXPECT_EQ(info["kind"], "lockstep checkpoint");
  EXPECT_EQ(info["verified"], true);
  EXPECT_EQ(info["iteration"], 2);  // max_iters 3, iterations count from 0
  EXPECT_EQ(info["meta"]["world_size"], 1);
  EXPECT_THAT(info["config"].get<std::string>(), HasSubstr("in_features: 16"));
  std::map<std::string, nlohmann::json> tensors;
  for (const auto& tensor : info["tensors"]) tensors[tensor["name"]] = tensor;
  const std::map<std::string, std::vector<int64_t>> expected_shapes{{"model/layers.1.weight", {8, 16}},
                                                                    {"model/layers.1.bias", {8}},
                                                                    {"model/layers.3.weight", {4, 8}},
                                                                    {"model/layers.3.bias", {4}}};
  for (const auto& [name, shape] : expected_shapes) {
    ASSERT_EQ(tensors.count(name), 1u) << name;
    EXPECT_EQ(tensors[name]["dtype"], "F32") << name;
    EXPECT_EQ(tensors[name]["shape"].get<std::vector<int64_t>>(), shape) << name;
    EXPECT_EQ(tensors[name]["bytes"].get<int64_t>(), 4 * c10::multiply_integers(shape)) << name;
  }
  EXPECT_EQ(info["parts"]["model"], 4);

  auto text = lockstep_cli({"ckpt", "inspect", checkpoint});
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("iteration: 2"));
  EXPECT_TRUE(std::regex_search(text.output, std::regex("model/layers\\.1\\.weight +F32 +\\[8, 16\\]"))) << text.output;
  EXPECT_THAT(text.output, HasSubstr("config:\n  randomness:"));
  EXPECT_THAT(lockstep_cli({"ckpt", "inspect", checkpoint, "--no-config"}).output,
              ::testing::Not(HasSubstr("config:")));

  // The data of the tensor stored last (names are stored in sorted order) is the file's tail.
  std::string last = info["tensors"].back()["name"];
  std::string bytes = testing::read_file(checkpoint);
  bytes[bytes.size() - 1] ^= 0x01;
  testing::write_file(dir.file("corrupt.ckpt"), bytes);
  auto corrupt = lockstep_cli({"ckpt", "inspect", dir.file("corrupt.ckpt")});
  EXPECT_EQ(corrupt.exit_code, 1) << corrupt.output;
  EXPECT_THAT(corrupt.output, HasSubstr(dir.file("corrupt.ckpt")));
  EXPECT_THAT(corrupt.output, HasSubstr("tensor '" + last + "' is corrupt"));
  auto missing = lockstep_cli({"ckpt", "inspect", dir.file("nothing.ckpt")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr(dir.file("nothing.ckpt") + ": no such file"));
}

// ---- export -----------------------------------------------------------------

TEST(CkptExportTest, AnIndependentReaderSeesTheModelsValues) {
  testing::TempDir dir;
  auto trained = train(dir, "run", run_config("0.05"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string checkpoint = dir.file("run/model_final.ckpt");
  State state = read_checkpoint_file(checkpoint);
  std::map<std::string, torch::Tensor> model = state.get("model").tensors;
  ASSERT_EQ(model.size(), 4u);

  for (const auto& [dtype, torch_dtype, stored] :
       std::vector<std::tuple<std::string, torch::ScalarType, std::string>>{
           {"keep", torch::kFloat32, "F32"}, {"bfloat16", torch::kBFloat16, "BF16"}, {"float16", torch::kFloat16, "F16"}}) {
    SCOPED_TRACE(dtype);
    const std::string out = dir.file("model-" + dtype + ".safetensors");
    auto exported = lockstep_cli({"ckpt", "export", checkpoint, "--format", "safetensors", "-o", out, "--dtype", dtype});
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    EXPECT_THAT(exported.output, HasSubstr("Wrote 4 tensors"));
    nlohmann::json read = python_read(out);
    EXPECT_EQ(read["metadata"]["format"], "pt");
    EXPECT_EQ(read["metadata"]["lockstep.iteration"], "2");
    ASSERT_EQ(read["tensors"].size(), model.size());
    for (const auto& [name, tensor] : model) {
      ASSERT_TRUE(read["tensors"].contains(name)) << name;
      const auto& entry = read["tensors"][name];
      EXPECT_EQ(entry["dtype"], stored) << name;
      EXPECT_EQ(entry["shape"].get<std::vector<int64_t>>(), tensor.sizes().vec()) << name;
      EXPECT_EQ(entry["values"].get<std::vector<double>>(), values_of(tensor.to(torch_dtype))) << name;
    }
  }
  auto bad = lockstep_cli({"ckpt", "export", checkpoint, "--format", "onnx", "-o", dir.file("x")});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("onnx not in {safetensors,pt,torchscript}"));
}

// ---- load_from --------------------------------------------------------------

// A "pretrained" file as another codebase would write it: an "encoder."
// prefix, a pooler the model lacks, a mis-shaped output layer, one missing
// bias, and mixed dtypes.
nlohmann::json pretrained_spec() {
  auto entry = [](const std::string& dtype, std::vector<int64_t> shape, std::vector<double> values) {
    return nlohmann::json{{"dtype", dtype}, {"shape", shape}, {"values", values}};
  };
  return {{"metadata", {{"format", "pt"}}},
          {"tensors",
           {{"encoder.layers.1.weight", entry("F32", {8, 16}, ramp(128, 0))},
            {"encoder.layers.1.bias", entry("F64", {8}, ramp(8, 200))},
            {"encoder.layers.3.weight", entry("F32", {5, 8}, ramp(40, 300))},
            {"encoder.pooler.dense.weight", entry("F16", {2, 2}, {0.5, 1.5, 2.5, 3.5})}}}};
}

TEST(LoadFromTest, PythonWrittenWeightsLoadWithRemappingAndAnExactReport) {
  testing::TempDir dir;
  python_write(dir.file("pretrained.safetensors"), pretrained_spec());

  auto model = std::make_shared<MLP>(MLPOptions().in_features(16).hidden({8}).num_classes(4));
  const torch::Tensor head_bias = model->named_parameters()["layers.3.bias"].detach().clone();
  auto strategy = std::make_shared<SingleDeviceStrategy>();
  strategy->prepare(model, Config(), Config(), SchedulerContext{});
  PretrainedReport report = load_pretrained(*strategy, PretrainedOptions()
                                                           .path(dir.file("pretrained.safetensors"))
                                                           .strip_prefix("encoder.")
                                                           .rename({{"^pooler\\.", "pool."}}));
  EXPECT_THAT(report.load.missing, UnorderedElementsAre("layers.3.bias"));
  EXPECT_THAT(report.load.unexpected, UnorderedElementsAre("pool.dense.weight"));
  ASSERT_EQ(report.load.mismatched.size(), 1u);
  EXPECT_THAT(report.load.mismatched[0], HasSubstr("layers.3.weight"));
  EXPECT_THAT(report.load.mismatched[0], HasSubstr("has [5, 8], the model has [4, 8]"));
  EXPECT_EQ(report.loaded, 2u);
  EXPECT_EQ(report.file_keys.at("pool.dense.weight"), "encoder.pooler.dense.weight");
  auto params = model->named_parameters();
  EXPECT_EQ(values_of(params["layers.1.weight"]), values_of(tensor_of(ramp(128, 0), {8, 16}, torch::kFloat32)));
  EXPECT_EQ(values_of(params["layers.1.bias"]), values_of(tensor_of(ramp(8, 200), {8}, torch::kFloat32)));
  EXPECT_TRUE(torch::equal(params["layers.3.bias"], head_bias));

  // The same through a run's config: training starts from those weights.
  const std::string load_from = R"(load_from:
  path: )" + dir.file("pretrained.safetensors") + R"(
  strip_prefix: encoder.
  rename: [["^pooler\\.", "pool."]]
)";
  auto trained = train(dir, "run", run_config("1.0e-30", load_from));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_THAT(trained.output, HasSubstr("layers.3.weight: " + dir.file("pretrained.safetensors") + " has [5, 8]"));
  EXPECT_THAT(trained.output, HasSubstr("pool.dense.weight <- encoder.pooler.dense.weight"));
  EXPECT_THAT(trained.output, HasSubstr("Loaded 2 tensors from"));
  State final_state = read_checkpoint_file(dir.file("run/model_final.ckpt"));
  EXPECT_EQ(values_of(final_state.tensors.at("model/layers.1.weight")),
            values_of(tensor_of(ramp(128, 0), {8, 16}, torch::kFloat32)));
  EXPECT_EQ(values_of(final_state.tensors.at("model/layers.1.bias")),
            values_of(tensor_of(ramp(8, 200), {8}, torch::kFloat32)));

  // strict: the run stops before training, naming the file and the keys.
  auto strict = train(dir, "strict", run_config("0.05", load_from), {"--set", "load_from.strict=true"});
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
  EXPECT_THAT(strict.output, HasSubstr("load_from (strict): cannot load the model weights from " +
                                       dir.file("pretrained.safetensors")));
  EXPECT_THAT(strict.output, HasSubstr("layers.3.bias"));
  EXPECT_FALSE(testing::file_exists(dir.file("strict/model_final.ckpt")));
}

TEST(LoadFromTest, ExportedWeightsStartAnotherRunExactly) {
  testing::TempDir dir;
  auto first = train(dir, "first", run_config("0.05"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto exported = lockstep_cli({"ckpt", "export", dir.file("first/model_final.ckpt"), "-o", dir.file("w.safetensors")});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  // --load-from gives the path; the config's load_from map adds strictness.
  auto second = train(dir, "second", run_config("1.0e-30", "load_from: {strict: true}\n"),
                      {"--load-from", dir.file("w.safetensors")});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  auto before = read_checkpoint_file(dir.file("first/model_final.ckpt")).get("model").tensors;
  auto after = read_checkpoint_file(dir.file("second/model_final.ckpt")).get("model").tensors;
  ASSERT_EQ(before.size(), after.size());
  for (const auto& [name, tensor] : before) EXPECT_TRUE(torch::equal(after.at(name), tensor)) << name;
}

// PyTorch's own file format on the user's path: torch.save writes a
// DDP-style checkpoint, `lockstep train` starts from it, `lockstep ckpt
// export --format pt` writes the result, and torch.load finds the same values.
TEST(LoadFromTest, TorchSaveFileRoundTripsThroughARun) {
  if (testing::run_command({testing::python(), "-c", "import torch"}, {}, 120).exit_code != 0) {
    GTEST_SKIP() << "no python3-torch";
  }
  testing::TempDir dir;
  const std::string weights = R"PY(
import torch
torch.manual_seed(3)
shapes = {'layers.1.weight': (8, 16), 'layers.1.bias': (8,), 'layers.3.weight': (4, 8), 'layers.3.bias': (4,)}
weights = {name: torch.randn(*shape) + 0.5 for name, shape in shapes.items()}
)PY";
  testing::write_file(dir.file("write.py"), weights + "torch.save({'state_dict': {'module.' + k: v for k, v in "
                                                      "weights.items()}, 'epoch': 7}, '" + dir.file("torch.pt") + "')\n");
  auto written = testing::run_command({testing::python(), dir.file("write.py")}, {}, 120);
  ASSERT_EQ(written.exit_code, 0) << written.output;
  auto inspected = lockstep_cli({"ckpt", "inspect", dir.file("torch.pt")});
  EXPECT_THAT(inspected.output, HasSubstr("PyTorch state dict (torch.save)"));
  EXPECT_THAT(inspected.output, HasSubstr("module.layers.1.weight"));

  auto run = train(dir, "run", run_config("1.0e-30", "load_from: {strip_prefix: module., strict: true}\n"),
                   {"--load-from", dir.file("torch.pt")});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto exported = lockstep_cli({"ckpt", "export", dir.file("run/model_final.ckpt"), "--format", "pt", "-o",
                                dir.file("out.pt")});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  testing::write_file(dir.file("check.py"), weights + "out = torch.load('" + dir.file("out.pt") + "', weights_only=True)\n"
                      "assert sorted(out) == sorted(weights), sorted(out)\n"
                      "assert all(torch.equal(out[k], weights[k]) for k in weights)\n"
                      "print('round trip: equal')\n");
  auto checked = testing::run_command({testing::python(), dir.file("check.py")}, {}, 120);
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_THAT(checked.output, HasSubstr("round trip: equal"));
}

}  // namespace
}  // namespace lockstep
