// CheckpointLayout: which part of a lockstep checkpoint holds what, in one
// place. Everything that writes or reads a checkpoint's parts goes through
// the types below; no other file spells a part's key.
//
//   CheckpointContents contents;
//   contents.model = strategy.model_state_dict();
//   contents.trainer = trainer.state();
//   contents.meta = RunMeta{42, /*iteration=*/99, /*world_size=*/2, "DDPStrategy", config_yaml};
//   write_checkpoint("work_dirs/run/model_0000099.ckpt", contents);   // atomic, with CRCs
//   CheckpointContents back = read_checkpoint("work_dirs/run/model_0000099.ckpt");
//
// In the file (a State, see checkpoint_file.h):
//   model/<name>                      parameters and buffers by name (full checkpoints)
//   optim_wrapper/...                 OptimWrapper(Dict)::state()
//   param_schedulers/<wrapper>/<i>/   scheduler states ("main" for the single optim wrapper)
//   trainer/...                       Trainer::state(): iteration, hook states, data position, RNG
//   meta                              {seed, iteration, world_size, strategy, config}
//   fsdp                              the manifest of a sharded checkpoint (below)
//
// A sharded checkpoint (FSDP's state_dict_type: sharded) is a manifest at
// `path` holding everything but the model and the optimizer, plus one shard
// file per rank beside it, `<path>.rank<r>-of-<N>.shard`, holding that rank's
// model shards and optimizer state. The manifest is written last, once every
// shard is on disk, so a manifest that exists names complete shards. Read at
// another world size, it is opened in parts (open_shard, and
// ShardedCheckpoint in sharded_checkpoint.h), each rank reading the pieces it
// needs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include "lockstep/core/state.h"
#include "lockstep/core/state_reader.h"

namespace lockstep {

// Who wrote a checkpoint, and when in the run.
struct RunMeta {
  uint64_t seed = 0;
  int64_t iteration = 0;
  int world_size = 1;
  std::string strategy;
  std::string config;  // the resolved YAML config
};

struct CheckpointContents {
  std::map<std::string, torch::Tensor> model;                     // empty in a sharded manifest
  std::optional<State> optim_wrapper;
  std::map<std::string, std::vector<State>> param_schedulers;     // by optim wrapper name ("" for a single one)
  std::optional<State> trainer;
  std::optional<RunMeta> meta;
  // A sharded manifest: {world_size, with_optimizer, layout} (FSDPStrategy's).
  std::optional<nlohmann::json> sharding;
  bool sharded() const { return sharding.has_value(); }
};

State to_state(const CheckpointContents& contents);
CheckpointContents contents_of(const State& state);

// What a checkpoint file holds besides its meta, for `lockstep ckpt inspect`:
// each part ("model", "optim_wrapper", "trainer", ...) with its tensor count.
std::map<std::string, int> checkpoint_parts(const State& state);

// write_checkpoint_file / read_checkpoint_file (atomic, CRC-checked) of the contents.
void write_checkpoint(const std::string& path, const CheckpointContents& contents);
CheckpointContents read_checkpoint(const std::string& path);
// The meta of a checkpoint, read without its tensors (header and values are
// verified); nullopt when it records none.
std::optional<RunMeta> read_checkpoint_meta(const std::string& path);

// The model weights of a checkpoint; an error naming `path` when it holds
// none (a sharded manifest says where its weights are instead).
const std::map<std::string, torch::Tensor>& model_weights(const CheckpointContents& contents, const std::string& path);

// One rank's file of a sharded checkpoint.
struct CheckpointShard {
  int rank = 0;
  int world_size = 1;
  State model;                         // FullyShardedDataParallel::sharded_state_dict()
  std::optional<State> optim_wrapper;
};

std::string shard_path(const std::string& manifest, int rank, int world_size);
// A DCP checkpoint (FSDPStrategy's state_dict_type: dcp): the manifest at
// `path` and the directory `dcp_directory(path)` beside it, "model_0000008.ckpt" ->
// "model_0000008.dcp", whose name the manifest records.
std::string dcp_directory(const std::string& manifest);
bool is_dcp_manifest(const CheckpointContents& contents);
std::string dcp_directory_of(const std::string& manifest, const CheckpointContents& contents);
// Before a DCP save (rank 0): the manifest at `manifest` is removed (so an
// earlier checkpoint of the same name no longer looks whole) and `dir` made empty.
void prepare_dcp_directory(const std::string& manifest, const std::string& dir);
// Deletes a checkpoint: the file at `path` and, for a sharded one, every
// shard file beside it (of whatever world size) or its DCP directory.
// Missing files are no error.
void remove_checkpoint(const std::string& path);
void write_shard(const std::string& manifest, const CheckpointShard& shard);
// Reads the shard of `rank` of a manifest written by `world_size` ranks.
CheckpointShard read_shard(const std::string& manifest, int rank, int world_size);
// The same file opened for reading in parts (StateReader: tensors read on demand).
struct ShardReader {
  StateReader model;                         // FullyShardedDataParallel::sharded_state_dict()
  std::optional<StateReader> optim_wrapper;  // absent: saved without the optimizer
};
ShardReader open_shard(const std::string& manifest, int rank, int world_size);

}  // namespace lockstep
