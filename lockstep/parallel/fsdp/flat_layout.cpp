#include "lockstep/parallel/fsdp/flat_layout.h"

#include <algorithm>

#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"

namespace lockstep::fsdp {

ShardOverlap shard_overlap(int64_t offset, int64_t numel, int shard_rank, int64_t shard_numel) {
  const int64_t first = shard_rank * shard_numel;
  const int64_t begin = std::max(offset, first);
  const int64_t end = std::min(offset + numel, first + shard_numel);
  if (begin >= end) return ShardOverlap{};
  return ShardOverlap{begin - first, begin - offset, end - begin};
}

std::vector<LayoutBlock> per_parameter_blocks(const std::vector<std::vector<int64_t>>& shapes, int shards) {
  std::vector<LayoutBlock> blocks;
  int64_t shard_offset = 0;
  for (const auto& shape : shapes) {
    LayoutBlock block;
    block.numel = 1;
    for (int64_t size : shape) block.numel *= size;
    const int64_t rows = shape.empty() ? 1 : shape.front();
    const int64_t row_numel = rows == 0 ? 0 : block.numel / rows;
    block.chunk = fsdp::shard_numel(rows, shards) * row_numel;
    block.shard_offset = shard_offset;
    block.full_offset = shard_offset * shards;
    shard_offset += block.chunk;
    blocks.push_back(block);
  }
  return blocks;
}

ShardLayout::ShardLayout(std::vector<LayoutBlock> blocks_in, int shard_rank_in, int shard_world_in)
    : shard_rank(shard_rank_in), shard_world(shard_world_in), blocks(std::move(blocks_in)) {
  for (const auto& block : blocks) {
    numel += block.numel;
    shard_numel += block.chunk;
  }
  padded_numel = shard_numel * shard_world;
}

ShardOverlap ShardLayout::part(int64_t offset, int64_t count) const {
  if (blocks.empty()) return shard_overlap(offset, count, shard_rank, shard_numel);
  for (const auto& block : blocks) {
    if (offset < block.full_offset || offset >= block.full_offset + block.chunk * shard_world) continue;
    LOCKSTEP_ASSERT(offset + count <= block.full_offset + block.numel, "elements [", offset, ", +", count,
                    ") leave the parameter at ", block.full_offset);
    ShardOverlap part = shard_overlap(offset - block.full_offset, count, shard_rank, block.chunk);
    if (part.length > 0) part.in_shard += block.shard_offset;
    return part;
  }
  LOCKSTEP_ASSERT(false, "elements [", offset, ", +", count, ") lie in no parameter of the layout");
  return ShardOverlap{};
}

torch::Tensor ShardLayout::shard_of(const torch::Tensor& full) const {
  if (blocks.empty()) return full.narrow(0, shard_rank * shard_numel, shard_numel);
  std::vector<torch::Tensor> pieces;
  for (const auto& block : blocks) pieces.push_back(full.narrow(0, block.full_offset + shard_rank * block.chunk, block.chunk));
  return pieces.empty() ? full.narrow(0, 0, 0) : torch::cat(pieces);
}

void ShardLayout::gathered_to_full(const torch::Tensor& gathered, torch::Tensor& full) const {
  torch::NoGradGuard no_grad;
  if (blocks.empty()) {
    if (!gathered.is_same(full)) full.copy_(gathered);
    return;
  }
  const torch::Tensor by_rank = gathered.view({shard_world, shard_numel});
  for (const auto& block : blocks) {
    full.narrow(0, block.full_offset, block.chunk * shard_world)
        .view({shard_world, block.chunk})
        .copy_(by_rank.narrow(1, block.shard_offset, block.chunk));
  }
}

LayoutPiece shard_piece(int64_t numel, int64_t shard_numel, int shard) {
  const int64_t begin = shard * shard_numel;
  return LayoutPiece{begin, std::clamp<int64_t>(numel - begin, 0, shard_numel)};
}

std::vector<LayoutPiece> shard_pieces(int64_t numel, int64_t shard_numel, int shards) {
  std::vector<LayoutPiece> pieces;
  for (int s = 0; s < shards; ++s) pieces.push_back(shard_piece(numel, shard_numel, s));
  return pieces;
}

void fill_from_pieces(torch::Tensor out, int64_t begin, const std::vector<LayoutPiece>& pieces,
                      const std::function<torch::Tensor(size_t piece, int64_t first, int64_t count)>& read) {
  torch::NoGradGuard no_grad;
  const int64_t end = begin + out.numel();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int64_t from = std::max(begin, pieces[i].begin);
    const int64_t to = std::min(end, pieces[i].begin + pieces[i].numel);
    if (from >= to) continue;
    out.narrow(0, from - begin, to - from).copy_(read(i, from - pieces[i].begin, to - from));
  }
}

torch::Tensor read_saved_piece(const StateReader& saved, const std::string& key, int64_t first, int64_t count,
                               int64_t saved_numel) {
  LOCKSTEP_CHECK(saved.contains(key), saved.source(), ": holds no '", key, "', though its shard holds ", count,
                 " of the elements needed from it");
  LOCKSTEP_CHECK(saved_numel < 0 || saved.entry(key).numel() == saved_numel, saved.source(), ": '", key, "' has ",
                 saved.entry(key).numel(), " elements, the layout says ", saved_numel);
  return saved.read_elements(key, first, count);
}

bool split_state_key(const std::string& key, std::string* position, std::string* buffer) {
  const size_t first = key.find('.');
  if (first == std::string::npos) return false;
  const size_t second = key.find('.', first + 1);
  if (second == std::string::npos) return false;
  *position = key.substr(0, second);
  *buffer = key.substr(second + 1);
  return true;
}

}  // namespace lockstep::fsdp
