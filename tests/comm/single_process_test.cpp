// The distributed API in a world of one, inside the test process: what a
// program sees before initialisation and without a launcher.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "tests/comm/dist_test_util.h"

namespace lockstep {
namespace {

using testing::error_of;
using testing::tensors_equal;

TEST(SingleProcess, QueriesAreSafeBeforeInit) {
  ASSERT_FALSE(is_initialized());
  EXPECT_EQ(get_rank(), 0);
  EXPECT_EQ(get_world_size(), 1);
  EXPECT_EQ(get_local_rank(), 0);
  EXPECT_EQ(get_local_size(), 1);
  EXPECT_TRUE(is_main_process());
  synchronize();
  std::map<std::string, double> values{{"loss", 0.25}};
  EXPECT_EQ(reduce_dict(values), values);
  EXPECT_GE(shared_random_seed(), 0);
  EXPECT_NE(error_of([] { world(); }).find("not initialised"), std::string::npos);
}

TEST(SingleProcess, WorldOfOneIsTheIdentity) {
  auto group = init_process_group(InitOptions());
  EXPECT_TRUE(is_initialized());
  EXPECT_EQ(local_group(), group);
  EXPECT_EQ(dist_env().launcher, "explicit");
  EXPECT_EQ(group->size(), 1);
  auto t = torch::arange(0, 4, torch::kFloat);
  group->all_reduce(t, ReduceOp::kAvg);
  EXPECT_TRUE(tensors_equal(t, torch::arange(0, 4, torch::kDouble)));
  auto out = torch::zeros({4});
  group->reduce_scatter_tensor(out, t);
  EXPECT_TRUE(tensors_equal(out, t));
  group->all_gather_into_tensor(out, t);
  EXPECT_TRUE(tensors_equal(out, t));
  std::vector<torch::Tensor> outs;
  group->all_gather(outs, t);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_TRUE(tensors_equal(outs[0], t));
  group->broadcast(t, 0);
  group->barrier();
  EXPECT_EQ(all_gather_object(std::string("x")), std::vector<std::string>{"x"});
  EXPECT_EQ(broadcast_object(nlohmann::json{{"a", 1}})["a"], 1);
  EXPECT_NE(error_of([] { init_process_group(InitOptions()); }).find("already initialised"), std::string::npos);
  destroy_process_group();
  EXPECT_FALSE(is_initialized());
}

TEST(SingleProcess, BadArgumentsAreErrorsNotCrashes) {
  auto group = init_process_group(InitOptions());
  auto ints = torch::ones({3}, torch::kLong);
  EXPECT_NE(error_of([&] { group->all_reduce(ints, ReduceOp::kAvg); }).find("needs a floating-point tensor"),
            std::string::npos);
  torch::Tensor undefined;
  EXPECT_NE(error_of([&] { group->all_reduce(undefined); }).find("undefined"), std::string::npos);
  auto out = torch::zeros({3});
  EXPECT_NE(error_of([&] { group->all_gather_into_tensor(out, torch::zeros({3}, torch::kLong)); })
                .find("output dtype"),
            std::string::npos);
  EXPECT_NE(error_of([&] { group->broadcast(out, 1); }).find("rank 1 is not in group 'world'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { group->new_group({0, 0}); }).find("listed twice"), std::string::npos);
  EXPECT_NE(error_of([&] { group->new_group({}); }).find("no ranks"), std::string::npos);
  destroy_process_group();
  EXPECT_NE(error_of([] { init_process_group(InitOptions().world_size(2).rank(2)); }).find("rank 2 is not in"),
            std::string::npos);
  EXPECT_NE(error_of([] { init_process_group(InitOptions().backend("mpi")); }).find("unknown backend 'mpi'"),
            std::string::npos);
  EXPECT_FALSE(is_initialized());
}

TEST(SingleProcess, TimeoutComesFromTheEnvironment) {
  setenv("LOCKSTEP_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(default_timeout(), std::chrono::milliseconds(2500));
  setenv("LOCKSTEP_TIMEOUT_S", "soon", 1);
  EXPECT_NE(error_of([] { default_timeout(); }).find("LOCKSTEP_TIMEOUT_S='soon'"), std::string::npos);
  unsetenv("LOCKSTEP_TIMEOUT_S");
  EXPECT_EQ(default_timeout(), std::chrono::minutes(30));
}

TEST(SingleProcess, CapabilitiesMatchWhatGlooDoes) {
  // The compat layer's claims about Gloo, checked against Gloo itself.
  auto group = init_process_group(InitOptions());
  auto caps = compat::gloo_capabilities();
  auto raw = group->raw();
  auto bf16 = torch::ones({4}, torch::kBFloat16);
  std::vector<at::Tensor> tensors{bf16};
  auto attempt = [](auto&& body) {
    try {
      body();
      return true;
    } catch (const std::exception&) {
      return false;
    }
  };
  EXPECT_EQ(attempt([&] { raw->allreduce(tensors)->wait(); }), caps.reduces_bfloat16);
  EXPECT_EQ(attempt([&] { raw->broadcast(tensors)->wait(); }), caps.moves_bfloat16);
  auto in = torch::ones({4}), out = torch::zeros({4});
  EXPECT_EQ(attempt([&] { raw->_reduce_scatter_base(out, in)->wait(); }), caps.reduce_scatter_base);
  EXPECT_EQ(attempt([&] { raw->_allgather_base(out, in)->wait(); }), caps.allgather_base);
  destroy_process_group();
}

}  // namespace
}  // namespace lockstep
