#include "lockstep/checkpoint/checkpoint_layout.h"

#include <filesystem>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// The part names, here and nowhere else.
const char* const kModel = "model";
const char* const kOptimWrapper = "optim_wrapper";
const char* const kSchedulers = "param_schedulers";
const char* const kTrainer = "trainer";
const char* const kMeta = "meta";
const char* const kSharding = "fsdp";
const char* const kMainWrapper = "main";  // the scheduler list of a single optim wrapper

nlohmann::json meta_json(const RunMeta& meta) {
  return {{"seed", meta.seed},
          {"iteration", meta.iteration},
          {"world_size", meta.world_size},
          {"strategy", meta.strategy},
          {"config", meta.config}};
}

RunMeta meta_of(const nlohmann::json& json) {
  RunMeta meta;
  meta.seed = json.value("seed", uint64_t{0});
  meta.iteration = json.value("iteration", int64_t{0});
  meta.world_size = json.value("world_size", 1);
  meta.strategy = json.value("strategy", std::string());
  meta.config = json.value("config", std::string());
  return meta;
}

}  // namespace

State to_state(const CheckpointContents& contents) {
  State state;
  if (contents.sharded()) {
    nlohmann::json manifest = *contents.sharding;
    manifest["state_dict_type"] = "sharded";
    state.values[kSharding] = std::move(manifest);
    state.values[kModel] = {{"fsdp_sharded", true}};
  } else {
    State model;
    model.tensors = contents.model;
    state.put(kModel, std::move(model));
  }
  if (contents.optim_wrapper) state.put(kOptimWrapper, *contents.optim_wrapper);
  if (!contents.param_schedulers.empty()) {
    State all;
    for (const auto& [wrapper, list] : contents.param_schedulers) {
      State per_wrapper;
      for (size_t i = 0; i < list.size(); ++i) per_wrapper.put(std::to_string(i), list[i]);
      all.put(wrapper.empty() ? kMainWrapper : wrapper, std::move(per_wrapper));
    }
    state.put(kSchedulers, std::move(all));
  }
  if (contents.trainer) state.put(kTrainer, *contents.trainer);
  if (contents.meta) state.values[kMeta] = meta_json(*contents.meta);
  return state;
}

std::map<std::string, int> checkpoint_parts(const State& state) {
  std::map<std::string, int> parts;
  for (const auto& item : state.values.items()) {
    if (item.key() != kMeta) parts[item.key()] = 0;
  }
  for (const auto& entry : state.tensors) ++parts[entry.first.substr(0, entry.first.find('/'))];
  return parts;
}

CheckpointContents contents_of(const State& state) {
  CheckpointContents contents;
  const nlohmann::json& values = state.values;
  if (values.is_object() && values.contains(kSharding) && values[kSharding].is_object() &&
      values[kSharding].value("state_dict_type", "") == "sharded") {
    nlohmann::json manifest = values[kSharding];
    manifest.erase("state_dict_type");
    contents.sharding = std::move(manifest);
  } else {
    contents.model = state.get(kModel).tensors;
  }
  if (state.contains(kOptimWrapper)) contents.optim_wrapper = state.get(kOptimWrapper);
  if (state.contains(kSchedulers)) {
    State all = state.get(kSchedulers);
    for (const auto& item : all.values.items()) {
      State per_wrapper = all.get(item.key());
      std::vector<State>& list = contents.param_schedulers[item.key() == kMainWrapper ? "" : item.key()];
      for (size_t i = 0; per_wrapper.contains(std::to_string(i)); ++i) list.push_back(per_wrapper.get(std::to_string(i)));
    }
  }
  if (state.contains(kTrainer)) contents.trainer = state.get(kTrainer);
  if (values.is_object() && values.contains(kMeta) && values[kMeta].is_object()) contents.meta = meta_of(values[kMeta]);
  return contents;
}

void write_checkpoint(const std::string& path, const CheckpointContents& contents) {
  write_checkpoint_file(path, to_state(contents));
}

CheckpointContents read_checkpoint(const std::string& path) { return contents_of(read_checkpoint_file(path)); }

std::optional<RunMeta> read_checkpoint_meta(const std::string& path) {
  const StateReader file = open_checkpoint_file(path);
  const nlohmann::json& values = file.values();
  if (!values.is_object() || !values.contains(kMeta) || !values[kMeta].is_object()) return std::nullopt;
  return meta_of(values[kMeta]);
}

const std::map<std::string, torch::Tensor>& model_weights(const CheckpointContents& contents, const std::string& path) {
  LOCKSTEP_CHECK(!contents.sharded(), path,
                 ": a sharded FSDP checkpoint: its model is split over the per-rank files beside it; `lockstep ckpt "
                 "export` makes one file of it, or save with `strategy: {state_dict_type: full}`");
  LOCKSTEP_CHECK(!contents.model.empty(), path, ": holds no model weights (no '", kModel, "/...' tensors)");
  return contents.model;
}

std::string shard_path(const std::string& manifest, int rank, int world_size) {
  return manifest + ".rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".shard";
}

std::string dcp_directory(const std::string& manifest) {
  return std::filesystem::path(manifest).replace_extension(".dcp").string();
}

bool is_dcp_manifest(const CheckpointContents& contents) {
  return contents.sharded() && contents.sharding->value("format", std::string()) == "dcp";
}

std::string dcp_directory_of(const std::string& manifest, const CheckpointContents& contents) {
  const std::string name = contents.sharding->value("directory", std::string());
  LOCKSTEP_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "..", manifest,
                 ": a DCP checkpoint's manifest must name its directory beside it, not '", name, "'");
  return (std::filesystem::path(manifest).parent_path() / name).string();
}

void prepare_dcp_directory(const std::string& manifest, const std::string& dir) {
  std::error_code error;
  std::filesystem::remove(manifest, error);
  std::filesystem::remove_all(dir, error);
  LOCKSTEP_CHECK(std::filesystem::create_directories(dir, error), dir, ": cannot create it for a checkpoint: ",
                 error ? error.message() : std::string("it is still there"));
}

void remove_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ignored;
  const fs::path manifest(path);
  const std::string lead = manifest.filename().string() + ".rank";
  const fs::path dir = manifest.has_parent_path() ? manifest.parent_path() : fs::path(".");
  std::vector<fs::path> shards;
  for (const auto& entry : fs::directory_iterator(dir, ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(lead, 0) == 0 && name.size() > 6 && name.compare(name.size() - 6, 6, ".shard") == 0) {
      shards.push_back(entry.path());
    }
  }
  // The manifest first: a checkpoint never looks whole while its shards go.
  fs::remove(manifest, ignored);
  for (const auto& shard : shards) fs::remove(shard, ignored);
  fs::remove_all(dcp_directory(path), ignored);
}

void write_shard(const std::string& manifest, const CheckpointShard& shard) {
  State state;
  state.put(kModel, shard.model);
  if (shard.optim_wrapper) state.put(kOptimWrapper, *shard.optim_wrapper);
  state.values[kSharding] = {{"rank", shard.rank}, {"world_size", shard.world_size}};
  write_checkpoint_file(shard_path(manifest, shard.rank, shard.world_size), state);
}

namespace {

// That the values of a shard file say it is the shard of `rank` of `world_size`.
void check_shard_values(const nlohmann::json& values, const std::string& path, int rank, int world_size) {
  LOCKSTEP_CHECK(values.is_object() && values.contains(kSharding) && values[kSharding].is_object(), path,
                 ": not a shard of a sharded checkpoint");
  const int saved_rank = values[kSharding].value("rank", -1);
  const int saved_world = values[kSharding].value("world_size", -1);
  LOCKSTEP_CHECK(saved_rank == rank && saved_world == world_size, path, ": holds the shard of rank ", saved_rank,
                 " of ", saved_world, ", not of rank ", rank, " of ", world_size);
}

}  // namespace

CheckpointShard read_shard(const std::string& manifest, int rank, int world_size) {
  const std::string path = shard_path(manifest, rank, world_size);
  State state = read_checkpoint_file(path);
  check_shard_values(state.values, path, rank, world_size);
  CheckpointShard shard;
  shard.rank = rank;
  shard.world_size = world_size;
  shard.model = state.get(kModel);
  if (state.contains(kOptimWrapper)) shard.optim_wrapper = state.get(kOptimWrapper);
  return shard;
}

ShardReader open_shard(const std::string& manifest, int rank, int world_size) {
  const std::string path = shard_path(manifest, rank, world_size);
  StateReader file = open_checkpoint_file(path);
  check_shard_values(file.values(), path, rank, world_size);
  ShardReader shard{file.part(kModel), std::nullopt};
  if (file.values().contains(kOptimWrapper)) shard.optim_wrapper = file.part(kOptimWrapper);
  return shard;
}

}  // namespace lockstep
