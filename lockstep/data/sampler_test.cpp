#include "lockstep/data/sampler.h"

#include <algorithm>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using Indices = std::vector<int64_t>;

Indices sorted(Indices v) {
  std::sort(v.begin(), v.end());
  return v;
}

Indices iota(int64_t n) {
  Indices v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Undoes the rank::world split: entry p of the padded order is rank p % world's entry p / world.
Indices interleave(const std::vector<Indices>& shares) {
  Indices out;
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (const auto& share : shares) {
      if (i < share.size()) {
        out.push_back(share[i]);
        any = true;
      }
    }
    if (!any) return out;
  }
}

TEST(DefaultSampler, UnshuffledRoundUpByHand) {
  // size 10, world 3: padded order 0..9, 0, 1; rank r takes r, r+3, r+6, r+9.
  EXPECT_EQ(DefaultSampler(10, false, 0, 0, 3).epoch_indices(0), (Indices{0, 3, 6, 9}));
  EXPECT_EQ(DefaultSampler(10, false, 0, 1, 3).epoch_indices(0), (Indices{1, 4, 7, 0}));
  EXPECT_EQ(DefaultSampler(10, false, 0, 2, 3).epoch_indices(0), (Indices{2, 5, 8, 1}));
  EXPECT_EQ(DefaultSampler(10, false, 0, 2, 3).num_samples(), 4);
}

TEST(DefaultSampler, ShardsAreTheSharedPermutationPaddedAndInterleaved) {
  const int world = 3;
  const int64_t size = 10;
  for (int64_t epoch : {0, 1, 5}) {
    const Indices perm = DefaultSampler(size, true, 42).permutation(epoch);
    ASSERT_EQ(sorted(perm), iota(size)) << "not a permutation";
    std::vector<Indices> shares;
    for (int rank = 0; rank < world; ++rank) {
      DefaultSampler sampler(size, true, 42, rank, world);
      shares.push_back(sampler.epoch_indices(epoch));
      EXPECT_EQ(static_cast<int64_t>(shares.back().size()), sampler.num_samples());
      // Every rank computes the same permutation on its own.
      EXPECT_EQ(sampler.permutation(epoch), perm);
    }
    // Padding repeats the first entries: the order rebuilt from the shares is perm + perm[0..1].
    Indices expected = perm;
    expected.push_back(perm[0]);
    expected.push_back(perm[1]);
    EXPECT_EQ(interleave(shares), expected);
  }
}

TEST(DefaultSampler, WithoutRoundUpShardsAreDisjointAndCoverTheDataset) {
  const int64_t size = 10;
  std::vector<Indices> shares;
  for (int rank = 0; rank < 3; ++rank) {
    DefaultSampler sampler(size, true, 7, rank, 3, /*round_up=*/false);
    shares.push_back(sampler.epoch_indices(2));
    EXPECT_EQ(static_cast<int64_t>(shares.back().size()), sampler.num_samples());
  }
  EXPECT_EQ(shares[0].size(), 4u);
  EXPECT_EQ(shares[1].size(), 3u);
  EXPECT_EQ(shares[2].size(), 3u);
  Indices all;
  for (const auto& share : shares) all.insert(all.end(), share.begin(), share.end());
  EXPECT_EQ(sorted(all), iota(size));  // disjoint and complete: each index exactly once
  EXPECT_EQ(interleave(shares), DefaultSampler(size, true, 7).permutation(2));
}

TEST(DefaultSampler, MoreRanksThanExamples) {
  // size 2, world 3: round_up pads to 3 entries by wrapping around; without it rank 2 gets nothing.
  const Indices perm = DefaultSampler(2, true, 1).permutation(0);
  EXPECT_EQ(DefaultSampler(2, true, 1, 2, 3).epoch_indices(0), (Indices{perm[0]}));
  EXPECT_EQ(DefaultSampler(2, true, 1, 2, 3, false).epoch_indices(0), Indices{});
  EXPECT_EQ(DefaultSampler(2, true, 1, 2, 3, false).num_samples(), 0);
  EXPECT_EQ(DefaultSampler(0, true, 1, 0, 1).epoch_indices(0), Indices{});
}

TEST(DefaultSampler, EpochsDifferAndSeedsReproduce) {
  DefaultSampler a(1000, true, 3), b(1000, true, 3), c(1000, true, 4);
  EXPECT_EQ(a.epoch_indices(0), b.epoch_indices(0));
  EXPECT_NE(a.epoch_indices(0), a.epoch_indices(1));
  EXPECT_NE(a.epoch_indices(0), c.epoch_indices(0));
  // mmengine seeds epoch e with seed + e, so (seed 3, epoch 1) is (seed 4, epoch 0).
  EXPECT_EQ(a.epoch_indices(1), c.epoch_indices(0));
  EXPECT_NE(a.epoch_indices(0), iota(1000));
}

TEST(DefaultSampler, IgnoresGlobalRandomState) {
  DefaultSampler sampler(500, true, 9, 1, 4);
  torch::manual_seed(1);
  const Indices first = sampler.epoch_indices(3);
  torch::manual_seed(2);
  torch::rand({100});
  EXPECT_EQ(sampler.epoch_indices(3), first);
}

TEST(SequentialSampler, RanksTakeEveryWorldthIndex) {
  EXPECT_EQ(SequentialSampler(5).epoch_indices(0), iota(5));
  EXPECT_EQ(SequentialSampler(5, 0, 2).epoch_indices(3), (Indices{0, 2, 4}));
  EXPECT_EQ(SequentialSampler(5, 1, 2).epoch_indices(3), (Indices{1, 3}));
  EXPECT_EQ(SequentialSampler(5, 1, 2).num_samples(), 2);
  EXPECT_EQ(SequentialSampler(1, 1, 2).num_samples(), 0);
}

TEST(InfiniteSampler, EpochsAreRoundedUpPermutations) {
  InfiniteSampler sampler(10, true, 5, 1, 3);
  EXPECT_TRUE(sampler.infinite());
  EXPECT_FALSE(DefaultSampler(10, true, 5).infinite());
  for (int64_t epoch : {0, 1}) {
    EXPECT_EQ(sampler.epoch_indices(epoch), DefaultSampler(10, true, 5, 1, 3).epoch_indices(epoch));
  }
  EXPECT_EQ(sampler.num_samples(), 4);
}

TEST(Sampler, BadArgumentsAreErrors) {
  EXPECT_THROW(DefaultSampler(10, true, 0, 3, 3), Error);
  EXPECT_THROW(DefaultSampler(10, true, 0, 0, 0), Error);
  EXPECT_THROW(DefaultSampler(-1, true, 0), Error);
  EXPECT_THROW(SequentialSampler(10, -1, 2), Error);
  EXPECT_THROW(DefaultSampler(10, true, 0).epoch_indices(-1), Error);
  try {
    DefaultSampler(10, true, 0, 4, 2);
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("rank 4 is outside 0..1"));
  }
}

TEST(SamplerRegistry, BuildsFromConfigWithContext) {
  SamplerContext ctx;
  ctx.rank = 1;
  ctx.world_size = 2;
  ctx.seed = 11;
  auto built = sampler_registry().build(parse_config("type: DefaultSampler\nshuffle: true\n"), 9, ctx);
  EXPECT_EQ(built->epoch_indices(2), DefaultSampler(9, true, 11, 1, 2).epoch_indices(2));
  // A seed in the config wins over the run's seed.
  auto seeded = sampler_registry().build(parse_config("type: DefaultSampler\nseed: 3\n"), 9, ctx);
  EXPECT_EQ(seeded->epoch_indices(0), DefaultSampler(9, true, 3, 1, 2).epoch_indices(0));
  auto eval = sampler_registry().build(parse_config("{type: DefaultSampler, shuffle: false, round_up: false}"), 9,
                                       ctx);
  EXPECT_EQ(eval->epoch_indices(0), (Indices{1, 3, 5, 7}));
  auto sequential = sampler_registry().build(parse_config("type: SequentialSampler"), 5, ctx);
  EXPECT_EQ(sequential->epoch_indices(0), (Indices{1, 3}));
  auto infinite = sampler_registry().build(parse_config("type: InfiniteSampler"), 9, ctx);
  EXPECT_TRUE(infinite->infinite());
  EXPECT_EQ(infinite->epoch_indices(1), DefaultSampler(9, true, 11, 1, 2).epoch_indices(1));

  try {
    sampler_registry().build(parse_config("type: DefaultSampler\nshufle: true\n", "s.yaml"), 9, ctx);
    ADD_FAILURE() << "a misspelt key was accepted";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("shufle"));
  }
}

}  // namespace
}  // namespace lockstep
