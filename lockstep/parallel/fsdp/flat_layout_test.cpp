#include "lockstep/parallel/fsdp/flat_layout.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace lockstep {
namespace {

// A layout of 10 elements over 3 shards: 4 per shard, padded to 12; shard 2
// holds elements 8 and 9 and two of padding.
TEST(FlatLayout, ShardsAreEqualAndThePaddingIsNobodysPiece) {
  EXPECT_EQ(fsdp::shard_numel(10, 3), 4);
  EXPECT_EQ(fsdp::shard_numel(12, 3), 4);
  EXPECT_EQ(fsdp::shard_numel(1, 4), 1);
  EXPECT_EQ(fsdp::shard_piece(10, 4, 1).begin, 4);
  EXPECT_EQ(fsdp::shard_piece(10, 4, 1).numel, 4);
  EXPECT_EQ(fsdp::shard_piece(10, 4, 2).numel, 2);
  EXPECT_EQ(fsdp::shard_piece(1, 1, 3).numel, 0);  // a shard of padding only
}

TEST(FlatLayout, StateDictNames) {
  EXPECT_EQ(fsdp::unit_key(""), "flat_param");  // the root unit
  EXPECT_EQ(fsdp::unit_key("layers.0"), "layers.0.flat_param");
  std::string position, buffer;
  ASSERT_TRUE(fsdp::split_state_key("0.12.exp_avg", &position, &buffer));
  EXPECT_EQ(position, "0.12");
  EXPECT_EQ(buffer, "exp_avg");
  ASSERT_TRUE(fsdp::split_state_key("1.3.momentum_buffer", &position, &buffer));
  EXPECT_EQ(buffer, "momentum_buffer");
  EXPECT_FALSE(fsdp::split_state_key("0.12", &position, &buffer));
  EXPECT_FALSE(fsdp::split_state_key("flat_param", &position, &buffer));
}

// Which part of a parameter's range a shard holds: shards of 4 elements, a
// parameter at [3, 10) of the layout.
TEST(ShardOverlap, EachShardHoldsItsPartOfARange) {
  auto part = [](int rank) {
    const fsdp::ShardOverlap o = fsdp::shard_overlap(/*offset=*/3, /*numel=*/7, rank, /*shard_numel=*/4);
    return std::vector<int64_t>{o.in_shard, o.in_range, o.length};
  };
  EXPECT_EQ(part(0), (std::vector<int64_t>{3, 0, 1}));  // element 3
  EXPECT_EQ(part(1), (std::vector<int64_t>{0, 1, 4}));  // elements 4..7
  EXPECT_EQ(part(2), (std::vector<int64_t>{0, 5, 2}));  // elements 8, 9
  EXPECT_EQ(part(3), (std::vector<int64_t>{0, 0, 0}));  // none
}

// Resharding: a layout of 10 elements saved in 3 shards of 4 ([0,4), [4,8),
// [8,10) and padding), cut again into 5 shards of 2. Each new shard reads the
// overlapping elements and nothing else.
TEST(ShardPieces, ANewShardIsCutFromTheOverlappingSavedPieces) {
  const auto pieces = fsdp::shard_pieces(/*numel=*/10, /*shard_numel=*/4, /*shards=*/3);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2].begin, 8);
  EXPECT_EQ(pieces[2].numel, 2);  // the padding is left out
  EXPECT_EQ(fsdp::shard_pieces(5, 4, 3)[2].numel, 0);
  const torch::Tensor layout = torch::arange(10, torch::kFloat);
  int64_t elements_read = 0;
  auto read = [&](size_t piece, int64_t first, int64_t count) {
    elements_read += count;
    return layout.narrow(0, pieces[piece].begin + first, count);
  };
  for (int64_t begin = 0; begin < 10; begin += 2) {
    torch::Tensor shard = torch::full({2}, -1.f);
    fsdp::fill_from_pieces(shard, begin, pieces, read);
    EXPECT_TRUE(torch::equal(shard, layout.narrow(0, begin, 2))) << begin;
  }
  EXPECT_EQ(elements_read, 10);
  torch::Tensor straddling = torch::zeros({6});  // [3, 9): three pieces
  fsdp::fill_from_pieces(straddling, 3, pieces, read);
  EXPECT_TRUE(torch::equal(straddling, layout.narrow(0, 3, 6)));
}

// Per-parameter sharding (FSDP2) against torch.chunk on dim 0: parameters of
// 7x3, 2 and 5x2 over 3 ranks hold rows {3,3,1}, {1,1,0} and {2,2,1}; each
// rank's shard is its chunks padded to 3, 1 and 2 rows, back to back; the
// all-gather of the shards, copied out, gives back every parameter.
TEST(PerParameterLayout, ShardsAreTorchChunksOfDimZero) {
  const std::vector<std::vector<int64_t>> shapes{{7, 3}, {2}, {5, 2}};
  const auto blocks = fsdp::per_parameter_blocks(shapes, 3);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].chunk, 9);
  EXPECT_EQ(blocks[1].chunk, 1);
  EXPECT_EQ(blocks[2].chunk, 4);
  EXPECT_EQ(blocks[1].shard_offset, 9);
  EXPECT_EQ(blocks[1].full_offset, 27);
  EXPECT_EQ(blocks[2].full_offset, 30);
  std::vector<torch::Tensor> params;
  for (const auto& shape : shapes) params.push_back(torch::randn(shape));
  // The full layout: each parameter, then its padding.
  torch::Tensor full = torch::zeros({fsdp::ShardLayout(blocks, 0, 3).padded_numel});
  for (size_t p = 0; p < params.size(); ++p) full.narrow(0, blocks[p].full_offset, params[p].numel()).copy_(params[p].reshape(-1));
  std::vector<torch::Tensor> shards;
  for (int rank = 0; rank < 3; ++rank) {
    const fsdp::ShardLayout layout(blocks, rank, 3);
    EXPECT_EQ(layout.shard_numel, 14);
    EXPECT_EQ(layout.numel, 21 + 2 + 10);
    const torch::Tensor shard = layout.shard_of(full);
    for (size_t p = 0; p < params.size(); ++p) {
      const auto chunks = params[p].chunk(3, 0);
      const torch::Tensor mine = rank < static_cast<int>(chunks.size()) ? chunks[rank].reshape(-1) : torch::empty({0});
      const fsdp::ShardOverlap part = layout.part(blocks[p].full_offset, params[p].numel());
      EXPECT_EQ(part.length, mine.numel()) << "parameter " << p << " rank " << rank;
      if (part.length > 0) {
        EXPECT_TRUE(torch::equal(shard.narrow(0, part.in_shard, part.length), mine)) << p << " " << rank;
        EXPECT_EQ(part.in_range, rank * blocks[p].chunk);
      }
    }
    shards.push_back(shard);
  }
  torch::Tensor regathered = torch::full_like(full, -1);
  fsdp::ShardLayout(blocks, 1, 3).gathered_to_full(torch::cat(shards), regathered);
  EXPECT_TRUE(torch::equal(regathered, full));
  // One rank: the layout is the parameters back to back, unpadded.
  const fsdp::ShardLayout alone(fsdp::per_parameter_blocks(shapes, 1), 0, 1);
  EXPECT_EQ(alone.padded_numel, 33);
}

}  // namespace
}  // namespace lockstep
