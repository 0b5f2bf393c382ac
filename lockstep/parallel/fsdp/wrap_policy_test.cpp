#include "lockstep/parallel/fsdp/wrap_policy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/parallel/fsdp/fsdp_options.h"

namespace lockstep {
namespace {

// blocks: ModuleList of two Sequential(Linear(10, 10) = 110, ReLU, Linear(10, 2) = 22); head: Linear(4, 3) = 15.
struct Tree : torch::nn::Module {
  Tree() {
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) {
      blocks->push_back(torch::nn::Sequential(torch::nn::Linear(10, 10), torch::nn::ReLU(), torch::nn::Linear(10, 2)));
    }
    head = register_module("head", torch::nn::Linear(4, 3));
  }
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::Linear head{nullptr};
};

TEST(WrapPolicy, SizeBasedWrapsChildrenFirstAndNeverModuleLists) {
  Tree tree;
  // 110 >= 100: each big Linear is a unit; its Sequential is left with 22 unwrapped.
  EXPECT_EQ(select_units(tree, *size_based_wrap_policy(100)), (std::vector<std::string>{"blocks.0.0", "blocks.1.0"}));
  // 132 per Sequential: the Sequentials are units; the ModuleList (264) is not, being a container.
  EXPECT_EQ(select_units(tree, *size_based_wrap_policy(120)), (std::vector<std::string>{"blocks.0", "blocks.1"}));
  EXPECT_TRUE(select_units(tree, *size_based_wrap_policy(1000)).empty());
}

TEST(WrapPolicy, FrozenParametersDoNotCount) {
  Tree tree;
  tree.blocks[0]->as<torch::nn::SequentialImpl>()->ptr(0)->parameters()[0].requires_grad_(false);  // 100 of 110
  EXPECT_EQ(select_units(tree, *size_based_wrap_policy(100)), (std::vector<std::string>{"blocks.1.0"}));
}

TEST(WrapPolicy, ModuleTypeMatchesLibtorchAndUserNames) {
  Tree tree;
  EXPECT_EQ(select_units(tree, *module_type_wrap_policy({"Linear"})),
            (std::vector<std::string>{"blocks.0.0", "blocks.0.2", "blocks.1.0", "blocks.1.2", "head"}));
  EXPECT_EQ(select_units(tree, *module_type_wrap_policy({"torch::nn::SequentialImpl"})),
            (std::vector<std::string>{"blocks.0", "blocks.1"}));
  EXPECT_TRUE(select_units(tree, *module_type_wrap_policy({"inear"})).empty());
}

TEST(WrapPolicy, LambdaSeesPathsAndCounts) {
  Tree tree;
  std::vector<std::pair<std::string, int64_t>> asked;
  auto policy = lambda_wrap_policy([&](const torch::nn::Module&, const std::string& path, int64_t unwrapped) {
    asked.emplace_back(path, unwrapped);
    return path == "head";
  });
  EXPECT_EQ(select_units(tree, *policy), (std::vector<std::string>{"head"}));
  EXPECT_EQ(asked.front(), (std::pair<std::string, int64_t>{"blocks.0.0", 110}));
  EXPECT_EQ(asked.back(), (std::pair<std::string, int64_t>{"head", 15}));
}

TEST(WrapPolicy, BuiltFromConfigByName) {
  Config config = parse_config(
      "a: size_based\n"
      "b: {type: size_based, min_num_params: 1e2}\n"
      "c: {type: module_type, module_types: [Linear]}\n"
      "d: no_such_policy\n"
      "e: {type: size_based, min_num_params: 1.5}\n",
      "policies.yaml");
  Tree tree;
  EXPECT_EQ(build_wrap_policy(config.at("a"))->describe(), "size_based(min_num_params=100000000)");
  EXPECT_EQ(select_units(tree, *build_wrap_policy(config.at("b"))).size(), 2u);
  EXPECT_EQ(select_units(tree, *build_wrap_policy(config.at("c"))).size(), 5u);
  EXPECT_EQ(build_wrap_policy(config.child("missing")), nullptr);
  try {
    build_wrap_policy(config.at("d"));
    ADD_FAILURE() << "unknown policy accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("policies.yaml:4"), std::string::npos) << message;
    EXPECT_NE(message.find("module_type, size_based"), std::string::npos) << message;
  }
  EXPECT_THROW(build_wrap_policy(config.at("e")), Error);
}

TEST(FsdpOptions, ParsedWithMmengineSpellings) {
  Config config = parse_config(
      "sharding_strategy: SHARD_GRAD_OP\n"
      "backward_prefetch: post\n"
      "forward_prefetch: true\n"
      "limit_all_gathers: false\n"
      "cpu_offload: {offload_params: true}\n"
      "mixed_precision: {param_dtype: bf16, reduce_dtype: fp32}\n"
      "fsdp_auto_wrap_policy: {type: size_based, min_num_params: 1000}\n",
      "wrapper.yaml");
  FSDPOptions options = parse_fsdp_options(config);
  EXPECT_EQ(options.sharding_strategy(), ShardingStrategy::kShardGradOp);
  EXPECT_EQ(options.backward_prefetch(), BackwardPrefetch::kPost);
  EXPECT_TRUE(options.forward_prefetch());
  EXPECT_EQ(options.limit_all_gathers(), 0);
  EXPECT_TRUE(options.offload_params());
  EXPECT_EQ(*options.mixed_precision().param_dtype(), torch::kBFloat16);
  EXPECT_EQ(*options.mixed_precision().reduce_dtype(), torch::kFloat32);
  EXPECT_FALSE(options.mixed_precision().buffer_dtype().has_value());
  EXPECT_EQ(options.auto_wrap_policy()->describe(), "size_based(min_num_params=1000)");
  EXPECT_TRUE(parse_fsdp_options(parse_config("cpu_offload: true\n")).offload_params());
  EXPECT_EQ(parse_fsdp_options(parse_config("limit_all_gathers: 3\n")).limit_all_gathers(), 3);
  EXPECT_TRUE(parse_fsdp_options(parse_config("x: 1\n")).overlap_reductions());
  EXPECT_FALSE(parse_fsdp_options(parse_config("overlap_reductions: false\n")).overlap_reductions());
  try {
    parse_fsdp_options(parse_config("x: 1\nsharding_strategy: ZERO3\n", "bad.yaml"));
    ADD_FAILURE() << "bad strategy accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("bad.yaml:2"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace lockstep
