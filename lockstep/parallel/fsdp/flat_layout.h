// The layout of an FSDP unit's flat parameter, without the unit: which rank
// owns which elements, and how the layout is named and cut in saved shards.
// Stateless arithmetic, shared by the runtime (FlatParamUnit, resharding) and
// by checkpoint/ (gathering a sharded checkpoint's weights), which needs no
// FSDP runtime to read a file.
//
// A unit's layout: its parameters' elements back to back in slot order, then
// zeros up to a multiple of the shard count; shard r holds
// [r * S, (r + 1) * S) with S = shard_numel(numel, shards).
//
//   const int64_t S = fsdp::shard_numel(/*numel=*/10, /*shards=*/3);        // 4 (padded to 12)
//   fsdp::ShardOverlap part = fsdp::shard_overlap(/*offset=*/3, /*numel=*/7, /*shard_rank=*/1, S);
//   // part: elements [4, 8) of the layout, at 0 in shard 1 and at 1 in the range
//   fsdp::fill_from_pieces(out, begin, fsdp::shard_pieces(10, S, 3), read_piece);   // resharding
//   fsdp::ShardLayout layout(/*numel=*/10, /*shard_rank=*/1, /*shard_world=*/3);   // the same, as one value
//   fsdp::unit_key("layers.0");                                              // "layers.0.flat_param"
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "lockstep/core/state_reader.h"

namespace lockstep::fsdp {

// Elements per shard of a layout of `numel` elements over `shards` shards.
inline int64_t shard_numel(int64_t numel, int shards) { return (numel + shards - 1) / shards; }

// The part of a flat layout's [offset, offset + numel) that shard
// `shard_rank` holds (shards of shard_numel elements, back to back): where it
// starts in the shard and in the range, and its length (0: none of it).
struct ShardOverlap {
  int64_t in_shard = 0;
  int64_t in_range = 0;
  int64_t length = 0;
};
ShardOverlap shard_overlap(int64_t offset, int64_t numel, int shard_rank, int64_t shard_numel);

// Note [Per-parameter layout]
// FSDP2 (PyTorch's fully_shard) shards each parameter on its own: rank r holds
// rows [r * c, (r + 1) * c) of dim 0, c = ceil(rows / N), the last ranks fewer
// or none (torch.chunk). Its collectives still move one flat buffer per unit:
// rank r's shard is the concatenation of its padded chunk of every parameter
// (c * (numel / rows) elements each, zeros past the parameter's end), and an
// all-gather of those shards is rank-major: rank 0's chunks, then rank 1's.
// The reduce-scatter input is built the same way (PyTorch's _chunk_cat).
// Here that is a layout of blocks, one per parameter: in the full layout
// (what `full`, the gathered parameters, and full-precision gathers hold)
// block b is contiguous, N * chunk_b elements at full_offset, its parameter
// first and its padding after it, so every parameter is a view of `full`; in
// a shard, block b is chunk_b elements at shard_offset. Gathering copies the
// rank-major result into the full layout (gathered_to_full), as FSDP2 copies
// out into its unsharded parameters. FSDP1's flat layout is the same thing
// with one block (the whole unit, padded at its end), which is what a
// layout without blocks means: every function below reads it that way, so
// FSDP1's arithmetic is unchanged.
struct LayoutBlock {
  int64_t full_offset = 0;   // in the full layout (N * shard_offset)
  int64_t shard_offset = 0;  // in each rank's shard
  int64_t numel = 0;         // the parameter's elements
  int64_t chunk = 0;         // elements per rank, padded: ceil(rows / N) * (numel / rows)
};
// The blocks of per-parameter sharding for parameters of these shapes over
// `shards` ranks, in order (a 0-dim parameter is one row).
std::vector<LayoutBlock> per_parameter_blocks(const std::vector<std::vector<int64_t>>& shapes, int shards);

// One rank's view of a layout of `numel` elements over `shard_world` shards.
struct ShardLayout {
  ShardLayout() = default;
  ShardLayout(int64_t numel, int shard_rank, int shard_world)
      : numel(numel),
        shard_numel(fsdp::shard_numel(numel, shard_world)),
        padded_numel(fsdp::shard_numel(numel, shard_world) * shard_world),
        shard_rank(shard_rank),
        shard_world(shard_world) {}
  // Per-parameter sharding (Note [Per-parameter layout]): `blocks` over
  // `shard_world` ranks; numel counts the parameters' elements.
  ShardLayout(std::vector<LayoutBlock> blocks, int shard_rank, int shard_world);
  // This rank's part of the layout's [offset, offset + count) (with blocks:
  // a range within one block).
  ShardOverlap part(int64_t offset, int64_t count) const;
  // This rank's shard of a tensor in the full layout (a view without blocks).
  torch::Tensor shard_of(const torch::Tensor& full) const;
  // Copies an all-gather's rank-major result into `full`, the full layout
  // (without blocks they are the same: gather into `full` directly).
  void gathered_to_full(const torch::Tensor& gathered, torch::Tensor& full) const;
  bool per_parameter() const { return !blocks.empty(); }

  int64_t numel = 0;         // the parameters' elements
  int64_t shard_numel = 0;   // elements per shard
  int64_t padded_numel = 0;  // shard_numel * shard_world: the layout with its padding
  int shard_rank = 0;
  int shard_world = 1;
  std::vector<LayoutBlock> blocks;  // empty: FSDP1's flat layout, one block
};

// A piece of a flat layout, elements [begin, begin + numel) of it; in a saved
// shard it is stored from element 0 of the saved tensor.
struct LayoutPiece {
  int64_t begin = 0;
  int64_t numel = 0;
};
// The elements of a layout of `numel` that shard `shard` holds (the padding
// left out: empty for a shard of padding only).
LayoutPiece shard_piece(int64_t numel, int64_t shard_numel, int shard);
// shard_piece of every shard, in order.
std::vector<LayoutPiece> shard_pieces(int64_t numel, int64_t shard_numel, int shards);
// Fills `out`, the layout's elements [begin, begin + out.numel()), from the
// pieces that overlap it; read(i, first, count) returns elements
// [first, first + count) of piece i's tensor. Only those elements are read.
void fill_from_pieces(torch::Tensor out, int64_t begin, const std::vector<LayoutPiece>& pieces,
                      const std::function<torch::Tensor(size_t piece, int64_t first, int64_t count)>& read);
// Elements [first, first + count) of `key` in a part of a saved shard file;
// the error names the file when it has no `key` or, with saved_numel >= 0, a
// `key` of another size than the saved layout says.
torch::Tensor read_saved_piece(const StateReader& saved, const std::string& key, int64_t first, int64_t count,
                               int64_t saved_numel = -1);

// How FSDP's state dicts name things: a unit's flat shard ("flat_param" for
// the root unit, whose path is ""), and the "<group>.<index>.<buffer>" keys of
// optimizer state.
inline std::string unit_key(const std::string& unit_path) {
  return unit_path.empty() ? "flat_param" : unit_path + ".flat_param";
}
// "0.12.exp_avg" -> {"0.12", "exp_avg"}; false for other keys.
bool split_state_key(const std::string& key, std::string* position, std::string* buffer);

}  // namespace lockstep::fsdp
