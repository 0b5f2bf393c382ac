// ShardedCheckpoint: a sharded FSDP checkpoint (checkpoint_layout.h) opened
// for reading at any world size. Shard files are opened when first needed,
// header only; their tensors, or runs of elements of them, are read when
// asked (StateReader), so a rank of a resharded run reads the parts of the
// saved shards that overlap its own and nothing else.
//
//   CheckpointContents manifest = read_checkpoint(path);        // sharded: manifest.sharded()
//   ShardedCheckpoint saved(path, *manifest.sharding);
//   State mine = fsdp.resharded_state_dict(saved.layout(), saved.model_parts());
//
//   // One file of the whole model (`lockstep ckpt export` of a sharded checkpoint):
//   std::map<std::string, torch::Tensor> weights = saved.full_weights();
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/core/state_reader.h"

namespace lockstep {

// Not thread-safe: files are opened lazily from const methods.
class ShardedCheckpoint {
 public:
  // `sharding` is the manifest's {world_size, with_optimizer, layout}.
  ShardedCheckpoint(std::string manifest, nlohmann::json sharding);

  const std::string& manifest() const { return manifest_; }
  int world_size() const { return world_size_; }           // ranks that wrote it
  int shard_world_size() const { return shard_world_; }    // ranks per shard group
  const nlohmann::json& layout() const { return sharding_.at("layout"); }
  bool with_optimizer() const { return sharding_.value("with_optimizer", false); }

  // The file written by saved rank `rank` (opened on first use).
  const ShardReader& file(int rank) const;
  // The file holding saved shard rank `shard_rank` (its replicas hold the same).
  const ShardReader& file_of_shard(int shard_rank) const;
  // The model part of the file of each saved shard rank, in shard rank order.
  std::vector<StateReader> model_parts() const;
  // The optim_wrapper part likewise; an error naming the file if one has none.
  std::vector<StateReader> optim_wrapper_parts() const;

  // Every parameter whole under all its names (tied ones too) and every
  // buffer in its own dtype: what full_state_dict() gives, read from the
  // shards one unit at a time.
  std::map<std::string, torch::Tensor> full_weights() const;

  // Tensor bytes read, and held, by the shard files opened so far.
  uint64_t bytes_read() const;
  uint64_t bytes_in_opened_files() const;
  int opened_files() const;

 private:
  std::string manifest_;
  nlohmann::json sharding_;
  int world_size_ = 1;
  int shard_world_ = 1;
  mutable std::vector<std::unique_ptr<ShardReader>> files_;  // by saved rank, null until opened
};

// The model weights of a checkpoint at `path`: a full checkpoint's own, or a
// sharded one's gathered from its shard files (ShardedCheckpoint::full_weights).
std::map<std::string, torch::Tensor> whole_model_weights(const CheckpointContents& contents, const std::string& path);

}  // namespace lockstep
