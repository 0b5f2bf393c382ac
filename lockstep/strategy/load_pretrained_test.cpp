#include "lockstep/strategy/load_pretrained.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/pretrained.h"
#include "lockstep/config/config_test_util.h"
#include "lockstep/model/model.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using config_test::error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// fc1: Linear(3 -> 2), fc2: Linear(2 -> 1).
class TwoLayers : public Model {
 public:
  TwoLayers() {
    fc1 = register_module("fc1", torch::nn::Linear(3, 2));
    fc2 = register_module("fc2", torch::nn::Linear(2, 1));
  }
  LossDict loss(const Batch& data) override {
    LossDict losses;
    losses.insert("loss", fc2(fc1(data.at("x"))).sum());
    return losses;
  }
  Batch predict(const Batch& data) override { return {{"y", fc2(fc1(data.at("x")))}}; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

std::shared_ptr<SingleDeviceStrategy> prepared(std::shared_ptr<TwoLayers> model) {
  auto strategy = std::make_shared<SingleDeviceStrategy>();
  strategy->prepare(std::move(model), Config(), Config(), SchedulerContext{});
  return strategy;
}

torch::Tensor counting(std::vector<int64_t> shape, float start) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return torch::arange(numel, torch::kFloat32).add(start).reshape(shape);
}

TEST(KeyRemapTest, StripsThenRenamesInOrderThenAdds) {
  KeyRemap remap(PretrainedOptions()
                     .strip_prefix("model.")
                     .rename({{"^encoder\\.(\\d+)\\.", "layers.$1."}, {"layers\\.3", "layers.three"}})
                     .add_prefix("net."));
  EXPECT_FALSE(remap.identity());
  EXPECT_EQ(remap.apply("model.encoder.3.weight"), "net.layers.three.weight");
  EXPECT_EQ(remap.apply("model.encoder.12.bias"), "net.layers.12.bias");
  // Keys without the prefix pass the strip unchanged; the regex is anchored at the start.
  EXPECT_EQ(remap.apply("head.encoder.1.w"), "net.head.encoder.1.w");
  EXPECT_TRUE(KeyRemap(PretrainedOptions()).identity());
  EXPECT_EQ(KeyRemap(PretrainedOptions()).apply("a.b"), "a.b");
}

TEST(KeyRemapTest, InvalidRegexIsNamed) {
  std::string message = error_of([] { KeyRemap(PretrainedOptions().rename({{"ok", ""}, {"(unclosed", "x"}})); });
  EXPECT_THAT(message, HasSubstr("rename rule 1"));
  EXPECT_THAT(message, HasSubstr("'(unclosed'"));
}

TEST(ParseLoadFromTest, PathOrMapWithBothRuleForms) {
  EXPECT_EQ(parse_load_from(Config()).path(), "");
  EXPECT_EQ(parse_load_from(parse_config("load_from: a.safetensors").at("load_from")).path(), "a.safetensors");
  Config config = parse_config(R"(load_from:
  path: hf/model.safetensors
  strip_prefix: "model."
  add_prefix: "backbone."
  strict: true
  rename:
    - {pattern: "^h\\.(\\d+)\\.", replacement: "blocks.$1."}
    - ["^ln_f\\.", "norm."]
)");
  PretrainedOptions options = parse_load_from(config.at("load_from"));
  EXPECT_EQ(options.path(), "hf/model.safetensors");
  EXPECT_EQ(options.strip_prefix(), "model.");
  EXPECT_EQ(options.add_prefix(), "backbone.");
  EXPECT_TRUE(options.strict());
  ASSERT_EQ(options.rename().size(), 2u);
  EXPECT_EQ(options.rename()[0].pattern, "^h\\.(\\d+)\\.");
  EXPECT_EQ(options.rename()[0].replacement, "blocks.$1.");
  EXPECT_EQ(options.rename()[1].pattern, "^ln_f\\.");
  EXPECT_EQ(KeyRemap(options).apply("model.h.7.attn"), "backbone.blocks.7.attn");
  // The command line's --load-from replaces the path and keeps the remapping.
  PretrainedOptions overridden = parse_load_from(config.at("load_from"), "other.safetensors");
  EXPECT_EQ(overridden.path(), "other.safetensors");
  EXPECT_EQ(overridden.strip_prefix(), "model.");
}

TEST(ParseLoadFromTest, MistakesNameTheConfigKey) {
  auto parse = [](const std::string& yaml) {
    return error_of([&] { parse_load_from(parse_config(yaml, "run.yaml").at("load_from")); });
  };
  EXPECT_THAT(parse("load_from: {path: a, strip_prefx: m.}"), HasSubstr("load_from.strip_prefx"));
  std::string bad_regex = parse("load_from:\n  path: a\n  rename:\n    - ['([', x]\n");
  EXPECT_THAT(bad_regex, HasSubstr("run.yaml:4"));
  EXPECT_THAT(bad_regex, HasSubstr("invalid regular expression '(['"));
  EXPECT_THAT(parse("load_from: {path: a, rename: [[a, b, c]]}"), HasSubstr("[pattern, replacement], got 3"));
  EXPECT_THAT(parse("load_from: {strip_prefix: m.}"), HasSubstr("missing key 'path'"));
}

TEST(LoadPretrainedTest, ReportsMissingUnexpectedAndMisShapedKeysAfterRemapping) {
  testing::TempDir dir;
  write_safetensors_file(dir.file("w.safetensors"),
                         {{"model.fc1.weight", counting({2, 3}, 1)},     // fits fc1.weight
                          {"model.fc1.bias", counting({5}, 0)},          // fc1.bias has 2 entries
                          {"model.proj.weight", counting({4}, 0)},       // no such module
                          {"other.fc2.bias", counting({1}, 42)}});       // no prefix to strip
  auto model = std::make_shared<TwoLayers>();
  const torch::Tensor bias_before = model->fc1->bias.detach().clone();
  const torch::Tensor fc2_before = model->fc2->weight.detach().clone();
  auto strategy = prepared(model);

  PretrainedReport report = load_pretrained(
      *strategy, PretrainedOptions().path(dir.file("w.safetensors")).strip_prefix("model.").rename({{"^proj", "head"}}));
  EXPECT_THAT(report.load.missing, UnorderedElementsAre("fc2.weight", "fc2.bias"));
  EXPECT_THAT(report.load.unexpected, UnorderedElementsAre("head.weight", "other.fc2.bias"));
  ASSERT_EQ(report.load.mismatched.size(), 1u);
  EXPECT_THAT(report.load.mismatched[0], HasSubstr("fc1.bias"));
  EXPECT_THAT(report.load.mismatched[0], HasSubstr("[5]"));
  EXPECT_THAT(report.load.mismatched[0], HasSubstr("[2]"));
  EXPECT_EQ(report.loaded, 1u);
  EXPECT_EQ(report.file_keys.at("head.weight"), "model.proj.weight");
  EXPECT_EQ(report.file_keys.at("fc1.weight"), "model.fc1.weight");
  EXPECT_EQ(report.file_keys.count("other.fc2.bias"), 0u);
  // The renamed keys the report lists appear with their file names.
  const std::string text = report.describe("w.safetensors");
  EXPECT_THAT(text, HasSubstr("head.weight <- model.proj.weight"));
  EXPECT_THAT(text, HasSubstr("fc1.bias <- model.fc1.bias"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("fc1.weight <-")));

  EXPECT_TRUE(torch::equal(model->fc1->weight, counting({2, 3}, 1)));
  EXPECT_TRUE(torch::equal(model->fc1->bias, bias_before));   // mis-shaped: left alone
  EXPECT_TRUE(torch::equal(model->fc2->weight, fc2_before));  // missing: left alone
}

TEST(LoadPretrainedTest, StrictFailsNamingFileAndKeys) {
  testing::TempDir dir;
  write_safetensors_file(dir.file("w.safetensors"), {{"fc1.weight", counting({2, 3}, 0)}, {"fc1.bias", counting({2}, 0)},
                                                      {"fc2.weight", counting({1, 2}, 0)}, {"fc9.bias", counting({1}, 0)}});
  auto strategy = prepared(std::make_shared<TwoLayers>());
  std::string message = error_of([&] {
    load_pretrained(*strategy, PretrainedOptions().path(dir.file("w.safetensors")).strict(true).rename({{"fc9", "head"}}));
  });
  EXPECT_THAT(message, HasSubstr(dir.file("w.safetensors")));
  EXPECT_THAT(message, HasSubstr("fc2.bias"));                 // missing
  EXPECT_THAT(message, HasSubstr("head.bias <- fc9.bias"));    // unexpected, with its file key
  // A file that fits loads strictly.
  write_safetensors_file(dir.file("ok.safetensors"), {{"fc1.weight", counting({2, 3}, 0)}, {"fc1.bias", counting({2}, 0)},
                                                       {"fc2.weight", counting({1, 2}, 0)}, {"fc2.bias", counting({1}, 0)}});
  PretrainedReport report = load_pretrained(*strategy, PretrainedOptions().path(dir.file("ok.safetensors")).strict(true));
  EXPECT_TRUE(report.load.clean());
  EXPECT_EQ(report.loaded, 4u);
}

TEST(LoadPretrainedTest, NotOneTensorFittingIsAnError) {
  testing::TempDir dir;
  write_safetensors_file(dir.file("w.safetensors"), {{"fc1.weight", counting({2, 3}, 0)}, {"fc1.bias", counting({2}, 0)}});
  auto strategy = prepared(std::make_shared<TwoLayers>());
  // A prefix the model does not have: nothing lands, and training on would start from scratch.
  std::string message = error_of(
      [&] { load_pretrained(*strategy, PretrainedOptions().path(dir.file("w.safetensors")).add_prefix("backbone.")); });
  EXPECT_THAT(message, HasSubstr("not one tensor of " + dir.file("w.safetensors") + " fits the model"));
  EXPECT_THAT(message, HasSubstr("remapping"));
  EXPECT_THAT(message, HasSubstr("backbone.fc1.weight <- fc1.weight"));
}

TEST(LoadPretrainedTest, TwoKeysOntoOneNameIsAnError) {
  testing::TempDir dir;
  write_safetensors_file(dir.file("w.safetensors"), {{"a.fc1.bias", counting({2}, 0)}, {"b.fc1.bias", counting({2}, 0)}});
  std::string message = error_of([&] {
    read_pretrained(PretrainedOptions().path(dir.file("w.safetensors")).rename({{"^[ab]\\.", ""}}));
  });
  EXPECT_THAT(message, HasSubstr("'a.fc1.bias'"));
  EXPECT_THAT(message, HasSubstr("'b.fc1.bias'"));
  EXPECT_THAT(message, HasSubstr("'fc1.bias'"));
}

TEST(LoadPretrainedTest, FromALockstepCheckpointWithAPrefix) {
  testing::TempDir dir;
  auto source = std::make_shared<TwoLayers>();
  auto source_strategy = prepared(source);
  source_strategy->save_checkpoint(dir.file("run.ckpt"), CheckpointContents(), CheckpointOptions());
  // Only the model part counts; its keys carry no "model/" prefix.
  auto weights = read_model_weights(dir.file("run.ckpt"));
  EXPECT_THAT([&] {
    std::vector<std::string> keys;
    for (const auto& item : weights) keys.push_back(item.first);
    return keys;
  }(), ElementsAre("fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"));

  auto target = std::make_shared<TwoLayers>();
  auto strategy = prepared(target);
  PretrainedReport report = load_pretrained(*strategy, PretrainedOptions().path(dir.file("run.ckpt")).strict(true));
  EXPECT_EQ(report.loaded, 4u);
  EXPECT_TRUE(torch::equal(target->fc1->weight, source->fc1->weight));
  EXPECT_TRUE(torch::equal(target->fc2->bias, source->fc2->bias));
}

TEST(LoadPretrainedTest, ShardedIndexMergesItsShards) {
  testing::TempDir dir;
  write_safetensors_file(dir.file("m-1.safetensors"), {{"fc1.weight", counting({2, 3}, 0)}, {"fc1.bias", counting({2}, 6)}});
  write_safetensors_file(dir.file("m-2.safetensors"), {{"fc2.weight", counting({1, 2}, 8)}, {"fc2.bias", counting({1}, 10)}});
  testing::write_file(dir.file("m.safetensors.index.json"), R"({"metadata": {"total_size": 44}, "weight_map": {
      "fc1.weight": "m-1.safetensors", "fc1.bias": "m-1.safetensors",
      "fc2.weight": "m-2.safetensors", "fc2.bias": "m-2.safetensors"}})");
  auto target = std::make_shared<TwoLayers>();
  auto strategy = prepared(target);
  PretrainedReport report =
      load_pretrained(*strategy, PretrainedOptions().path(dir.file("m.safetensors.index.json")).strict(true));
  EXPECT_EQ(report.loaded, 4u);
  EXPECT_TRUE(torch::equal(target->fc2->weight, counting({1, 2}, 8)));

  testing::write_file(dir.file("bad.safetensors.index.json"), R"({"weight_map": {"fc3.weight": "m-2.safetensors"}})");
  std::string message = error_of([&] { read_model_weights(dir.file("bad.safetensors.index.json")); });
  EXPECT_THAT(message, HasSubstr("bad.safetensors.index.json"));
  EXPECT_THAT(message, HasSubstr("'fc3.weight'"));
  EXPECT_THAT(message, HasSubstr("m-2.safetensors"));
}

TEST(LoadPretrainedTest, ShardedFsdpCheckpointsAreNamedOutsideFsdp) {
  testing::TempDir dir;
  // What FSDPStrategy's rank 0 writes for state_dict_type: sharded: no model tensors in the main file.
  State sharded;
  sharded.values["fsdp"] = {{"state_dict_type", "sharded"}, {"world_size", 2}};
  sharded.tensors["trainer/rng/cpu"] = torch::zeros({4}, torch::kUInt8);
  write_checkpoint_file(dir.file("s.ckpt"), sharded);
  EXPECT_THAT(error_of([&] { read_model_weights(dir.file("s.ckpt")); }), HasSubstr("a sharded FSDP checkpoint"));
  auto strategy = prepared(std::make_shared<TwoLayers>());
  std::string message = error_of([&] { load_pretrained(*strategy, PretrainedOptions().path(dir.file("s.ckpt"))); });
  EXPECT_THAT(message, HasSubstr(dir.file("s.ckpt")));
  EXPECT_THAT(message, HasSubstr("loads only into FSDPStrategy (this run uses SingleDeviceStrategy)"));
}

TEST(LoadPretrainedTest, BadFilesAreNamed) {
  testing::TempDir dir;
  auto strategy = prepared(std::make_shared<TwoLayers>());
  EXPECT_THAT(error_of([&] { load_pretrained(*strategy, PretrainedOptions().path(dir.file("none.safetensors"))); }),
              HasSubstr("none.safetensors does not exist"));
  testing::write_file(dir.file("short.safetensors"), "abc");
  EXPECT_THAT(error_of([&] { read_model_weights(dir.file("short.safetensors")); }),
              HasSubstr(dir.file("short.safetensors")));
  // A truncated file: the error names the file and the tensor whose bytes are gone.
  write_safetensors_file(dir.file("t.safetensors"), {{"fc1.weight", counting({64}, 0)}});
  std::string bytes = testing::read_file(dir.file("t.safetensors"));
  testing::write_file(dir.file("t.safetensors"), bytes.substr(0, bytes.size() - 10));
  std::string message = error_of([&] { read_model_weights(dir.file("t.safetensors")); });
  EXPECT_THAT(message, HasSubstr(dir.file("t.safetensors")));
  EXPECT_THAT(message, HasSubstr("fc1.weight"));
  // A checkpoint without a model part.
  State no_model;
  no_model.tensors["optim_wrapper/x"] = torch::zeros({1});
  write_checkpoint_file(dir.file("n.ckpt"), no_model);
  EXPECT_THAT(error_of([&] { read_model_weights(dir.file("n.ckpt")); }), HasSubstr("holds no model weights"));
}

}  // namespace
}  // namespace lockstep
