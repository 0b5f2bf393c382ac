#include "lockstep/parallel/fsdp/flat_layout.h"

#include <algorithm>

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::fsdp {

ShardOverlap shard_overlap(int64_t offset, int64_t numel, int shard_rank, int64_t shard_numel) {
  const int64_t first = shard_rank * shard_numel;
  const int64_t begin = std::max(offset, first);
  const int64_t end = std::min(offset + numel, first + shard_numel);
  if (begin >= end) return ShardOverlap{};
  return ShardOverlap{begin - first, begin - offset, end - begin};
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
