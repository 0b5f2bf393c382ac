#include "lockstep/parallel/ddp/powersgd_hook.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// numpy 1.24: [np.random.RandomState(s).randint(1_000_000_000) for ...].
TEST(PowerSGDTest, LegacyNumpyRandomDrawsWhatNumpyDraws) {
  LegacyNumpyRandom zero(0);
  EXPECT_EQ(zero.randint(1000000000), 209652396);
  EXPECT_EQ(zero.randint(1000000000), 398764591);
  const std::string saved = zero.save();
  EXPECT_EQ(zero.randint(1000000000), 924231285);
  LegacyNumpyRandom restored(12345);
  restored.load(saved);
  EXPECT_EQ(restored.randint(1000000000), 924231285);
  LegacyNumpyRandom seven(7);
  EXPECT_EQ(seven.randint(1000000000), 327741615);
  EXPECT_EQ(seven.randint(1000000000), 976413892);
  EXPECT_THROW(LegacyNumpyRandom(1).load("not a state"), Error);
}

// Gram-Schmidt (rank <= 2) and QR (rank > 2) both leave orthonormal columns
// spanning the input's column space.
TEST(PowerSGDTest, OrthogonalizeLeavesOrthonormalColumnsOfTheSameSpan) {
  torch::manual_seed(3);
  for (int64_t rank : {1, 2, 4}) {
    torch::Tensor input = torch::randn({3, 20, rank}, torch::kDouble);
    torch::Tensor q = input.clone();
    orthogonalize(q);
    torch::Tensor gram = torch::bmm(q.transpose(1, 2), q);
    EXPECT_TRUE(torch::allclose(gram, torch::eye(rank, torch::kDouble).expand({3, rank, rank}), 1e-10, 1e-10))
        << "rank " << rank;
    // Projecting the input on Q's columns gives the input back.
    torch::Tensor projected = torch::bmm(q, torch::bmm(q.transpose(1, 2), input));
    EXPECT_TRUE(torch::allclose(projected, input, 1e-10, 1e-10)) << "rank " << rank;
  }
  EXPECT_THROW(orthogonalize(torch::randn({4, 2})), Error);
}

TEST(PowerSGDTest, ConfigErrorsNameTheKey) {
  try {
    make_comm_hook(parse_config("{type: PowerSGD, start_powerSGD_iter: 1}", "hook.yaml"));
    ADD_FAILURE() << "start_powerSGD_iter 1 with error feedback was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("start_powerSGD_iter"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("must be > 1"), std::string::npos) << error.what();
  }
  try {
    make_comm_hook(parse_config("{type: PowerSGD, matrix_aproximation_rank: 4}", "hook.yaml"));
    ADD_FAILURE() << "a misspelt key was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("matrix_aproximation_rank"), std::string::npos) << error.what();
  }
  try {
    make_comm_hook(parse_config("{comm_hook: fp32_compress}", "hook.yaml").at("comm_hook"));
    ADD_FAILURE() << "an unknown hook was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("hook.yaml:1 (key comm_hook): unknown comm hook type 'fp32_compress'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("PowerSGD"), std::string::npos) << error.what();
  }
  auto hook = make_comm_hook(parse_config("{type: PowerSGD, matrix_approximation_rank: 4, start_powerSGD_iter: 2}"));
  auto* powersgd = dynamic_cast<PowerSGDHook*>(hook.get());
  ASSERT_NE(powersgd, nullptr);
  EXPECT_EQ(powersgd->options().matrix_approximation_rank(), 4);
  EXPECT_TRUE(powersgd->options().use_error_feedback());
  // A fresh hook's state round-trips.
  PowerSGDHook other;
  other.load_state(powersgd->state());
  EXPECT_EQ(other.iteration(), 0);
}

// Resumed at another world size: what every rank shares comes back, the
// per-rank error feedback starts at zero.
TEST(PowerSGDTest, OtherWorldSizeKeepsTheSharedStateOnly) {
  State saved;
  saved.values["iter"] = 5;
  saved.values["total_numel_before_compression"] = 100;
  saved.values["total_numel_after_compression"] = 10;
  saved.values["next_stats_report"] = 0;
  saved.values["rng"] = LegacyNumpyRandom(3).save();
  saved.tensors["error.0"] = torch::ones({4});
  saved.tensors["p.0"] = torch::full({2}, 2.0);
  saved.tensors["q.0"] = torch::full({2}, 3.0);
  PowerSGDHook same;
  same.load_state(saved);
  EXPECT_EQ(same.state().tensors.count("error.0"), 1u);
  PowerSGDHook other;
  EXPECT_TRUE(other.load_state_from_other_world_size(saved));
  EXPECT_EQ(other.iteration(), 5);
  State kept = other.state();
  EXPECT_EQ(kept.tensors.count("error.0"), 0u);
  EXPECT_TRUE(torch::equal(kept.tensors.at("q.0"), saved.tensors.at("q.0")));
  EXPECT_EQ(std::get<1>(other.compression_stats()), 100);
}

}  // namespace
}  // namespace lockstep
