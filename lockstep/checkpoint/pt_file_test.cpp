// PyTorch .pt files against Debian's python3-torch: what torch.save writes,
// lockstep reads; what lockstep writes, torch.load reads. Each side computes
// the expected values on its own from the same formulas.
#include "lockstep/checkpoint/pt_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/pretrained.h"
#include "lockstep/checkpoint/safetensors_tools.h"
#include "tests/support/same_tensors.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::lockstep::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

#define REQUIRE_PYTHON_TORCH() \
  if (!testing::python_has("torch")) GTEST_SKIP() << "no python3-torch (Debian's python3-torch is the reference)"

// Runs a Python snippet with `dir` as its working directory.
std::string python(const testing::TempDir& dir, const std::string& code) {
  testing::write_file(dir.file("script.py"), "import os, torch\nos.chdir(" + std::string("'") + dir.path() + "')\n" + code);
  auto result = testing::run_command({testing::python(), dir.file("script.py")}, {}, 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return result.output;
}

// The tensors both sides build: every dtype a state dict holds, a 0-d
// tensor, an empty one, a transposed (non-contiguous) one and two views of
// one storage.
const char* kPythonExpected = R"PY(
def expected():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 8 - 1
    shared = torch.arange(10, dtype=torch.float64) * 0.5
    return {
        "conv.weight": base,
        "conv.bias": base[0].clone(),
        "half": base.to(torch.float16),
        "bf16": base.to(torch.bfloat16),
        "double": base.to(torch.float64),
        "long": torch.arange(7, dtype=torch.int64) * 3 - 5,
        "int": torch.arange(5, dtype=torch.int32) - 2,
        "int8": torch.arange(6, dtype=torch.int8) - 3,
        "uint8": torch.arange(6, dtype=torch.uint8) * 40,
        "bool": torch.arange(5) % 2 == 0,
        "bn.num_batches_tracked": torch.tensor(17),
        "empty": torch.zeros(0, 3),
        "transposed": base.t(),
        "view.first": shared[:4],
        "view.strided": shared[1::3],
    }
)PY";

std::map<std::string, torch::Tensor> expected() {
  torch::Tensor base = torch::arange(24, torch::kFloat).reshape({4, 6}) / 8 - 1;
  torch::Tensor shared = torch::arange(10, torch::kDouble) * 0.5;
  return {{"conv.weight", base},
          {"conv.bias", base[0].clone()},
          {"half", base.to(torch::kHalf)},
          {"bf16", base.to(torch::kBFloat16)},
          {"double", base.to(torch::kDouble)},
          {"long", torch::arange(7, torch::kLong) * 3 - 5},
          {"int", torch::arange(5, torch::kInt) - 2},
          {"int8", torch::arange(6, torch::kChar) - 3},
          {"uint8", torch::arange(6, torch::kByte) * 40},
          {"bool", torch::arange(5).remainder(2) == 0},
          {"bn.num_batches_tracked", torch::tensor(17, torch::kLong)},
          {"empty", torch::zeros({0, 3})},
          {"transposed", base.t()},
          {"view.first", shared.slice(0, 0, 4)},
          {"view.strided", shared.slice(0, 1, 10, 3)}};
}

void expect_equal(const std::map<std::string, torch::Tensor>& actual) {
  EXPECT_TRUE(testing::same_tensors(actual, expected()));
}

TEST(PtFile, ReadsTheStateDictTorchSaveWrote) {
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  python(dir, std::string(kPythonExpected) + "torch.save(expected(), 'plain.pt')\n"
         "import collections\ntorch.save(collections.OrderedDict(expected()), 'ordered.pt')\n"
         "m = torch.nn.Linear(6, 4)\nsd = m.state_dict()\nsd.update(expected())\ntorch.save(sd, 'module_state.pt')\n");
  EXPECT_TRUE(is_torch_save_file(dir.file("plain.pt")));
  expect_equal(read_pt_state_dict(dir.file("plain.pt")));
  expect_equal(read_pt_state_dict(dir.file("ordered.pt")));
  // A module's state_dict(): an OrderedDict with _metadata, Linear's own entries first.
  auto module_state = read_pt_state_dict(dir.file("module_state.pt"));
  EXPECT_EQ(module_state.at("weight").sizes(), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(module_state.size(), expected().size() + 2);
}

TEST(PtFile, FindsTheStateDictInsideCommonCheckpoints) {
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  python(dir, std::string(kPythonExpected) +
                  "import argparse\n"
                  "torch.save({'state_dict': expected(), 'epoch': 3, 'meta': {'args': argparse.Namespace(lr=0.1),"
                  " 'hist': [1.5, None, (2, 'x')]}}, 'mmengine.pt')\n"
                  "p = torch.nn.Parameter(torch.ones(2))\nopt = torch.optim.SGD([p], lr=0.1, momentum=0.9)\n"
                  "p.grad = torch.ones(2)\nopt.step()\n"
                  "torch.save({'model': expected(), 'optimizer': opt.state_dict()}, 'detectron2.pt')\n"
                  "torch.save({'w': torch.nn.Parameter(torch.arange(3.0))}, 'parameter.pt')\n");
  expect_equal(read_pt_state_dict(dir.file("mmengine.pt")));
  expect_equal(read_pt_state_dict(dir.file("detectron2.pt")));
  EXPECT_TRUE(torch::equal(read_pt_state_dict(dir.file("parameter.pt")).at("w"), torch::arange(3.0)));
}

TEST(PtFile, WhatLockstepWritesTorchLoadReads) {
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  write_pt_state_dict(expected(), dir.file("ours.pt"));
  expect_equal(read_pt_state_dict(dir.file("ours.pt")));
  const std::string output = python(dir, std::string(kPythonExpected) + R"PY(
got = torch.load('ours.pt', weights_only=True)  # the default since PyTorch 2.6
want = expected()
assert sorted(got) == sorted(want), (sorted(got), sorted(want))
for k in want:
    assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and torch.equal(got[k], want[k]), k
m = torch.nn.Linear(6, 4)
m.load_state_dict({'weight': got['conv.weight'], 'bias': got['conv.weight'][:, 0]})
print('torch.load: equal')
)PY");
  EXPECT_THAT(output, HasSubstr("torch.load: equal"));
}

TEST(PtFile, ExportWritesACheckpointsModelWeightsAsAStateDict) {
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  State state;
  state.tensors["model/fc.weight"] = torch::randn({3, 4});
  state.tensors["model/bn.num_batches_tracked"] = torch::tensor(5, torch::kLong);
  state.tensors["optim_wrapper/optimizer/state/0/momentum_buffer"] = torch::randn({3, 4});
  state.values["meta"] = {{"iteration", 9}};
  write_checkpoint_file(dir.file("run.ckpt"), state);
  EXPECT_EQ(export_weights(dir.file("run.ckpt"), dir.file("model.pt"), ExportOptions().format(ExportFormat::kPt)), 2u);
  auto weights = read_pt_state_dict(dir.file("model.pt"));
  EXPECT_TRUE(torch::equal(weights.at("fc.weight"), state.tensors.at("model/fc.weight")));
  const std::string output = python(dir, "sd = torch.load('model.pt', weights_only=True)\nprint(sorted(sd), sd['bn.num_batches_tracked'].item())\n");
  EXPECT_THAT(output, HasSubstr("['bn.num_batches_tracked', 'fc.weight'] 5"));
}

TEST(PtFile, LoadFromReadsItWithTheUsualRemapping) {
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  python(dir, "torch.save({'module.fc.weight': torch.ones(2, 3), 'module.fc.bias': torch.zeros(2)}, 'ddp.pt')\n");
  PretrainedSource source = read_pretrained(PretrainedOptions().path(dir.file("ddp.pt")).strip_prefix("module."));
  EXPECT_EQ(source.weights.tensors.size(), 2u);
  EXPECT_TRUE(torch::equal(source.weights.tensors.at("fc.weight"), torch::ones({2, 3})));
}

TEST(PtFile, WhatIsNotAStateDictIsAnErrorNamingTheFileAndWhatItHolds) {
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  python(dir, "m = torch.nn.Sequential(torch.nn.Linear(3, 2))\n"
              "torch.save(m, 'module.pt')\n"
              "torch.jit.script(m).save('scripted.pt')\n"
              "torch.save(m.state_dict(), 'legacy.pt', _use_new_zipfile_serialization=False)\n"
              "torch.save({'lr': 0.1, 'names': ['a']}, 'numbers.pt')\n"
              "torch.save(m.state_dict(), 'good.pt')\n"
              "data = open('good.pt', 'rb').read()\nopen('truncated.pt', 'wb').write(data[:len(data) // 2])\n");
  const std::string module = dir.file("module.pt");
  EXPECT_THAT(error_of([&] { read_pt_state_dict(module); }),
              AllOf(HasSubstr(module), HasSubstr("torch.nn.modules.container.Sequential"),
                    HasSubstr("save model.state_dict() instead")));
  EXPECT_THAT(error_of([&] { read_pt_state_dict(dir.file("scripted.pt")); }),
              AllOf(HasSubstr("scripted.pt"), HasSubstr("TorchScript archive")));
  EXPECT_THAT(error_of([&] { read_pt_state_dict(dir.file("legacy.pt")); }),
              AllOf(HasSubstr("legacy.pt"), HasSubstr("legacy format")));
  EXPECT_THAT(error_of([&] { read_pt_state_dict(dir.file("numbers.pt")); }),
              AllOf(HasSubstr("numbers.pt: no state dict in it"), HasSubstr("'lr' (a float)"),
                    HasSubstr("'names' (a list of 1)")));
  EXPECT_THAT(error_of([&] { read_pt_state_dict(dir.file("truncated.pt")); }),
              AllOf(HasSubstr("truncated.pt"), HasSubstr("not a readable torch.save archive")));
  testing::write_file(dir.file("text.pt"), "hello\n");
  EXPECT_THAT(error_of([&] { read_pt_state_dict(dir.file("text.pt")); }),
              HasSubstr("text.pt: not a torch.save file"));
  EXPECT_THAT(error_of([&] { read_pt_state_dict(dir.file("absent.pt")); }), HasSubstr("absent.pt: cannot open"));
  // load_from goes through the same reader.
  EXPECT_THAT(error_of([&] { read_pretrained(PretrainedOptions().path(module)); }), HasSubstr(module));
}

}  // namespace
}  // namespace lockstep
