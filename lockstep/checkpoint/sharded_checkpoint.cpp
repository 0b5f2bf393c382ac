#include "lockstep/checkpoint/sharded_checkpoint.h"

#include "lockstep/checkpoint/dcp_checkpoint.h"

#include "lockstep/core/error.h"
#include "lockstep/parallel/fsdp/flat_layout.h"

namespace lockstep {
namespace {

// The sharding strategy's shard rank a file was written from.
int shard_rank_of(const ShardReader& file) { return file.model.values().value("shard_rank", -1); }

}  // namespace

ShardedCheckpoint::ShardedCheckpoint(std::string manifest, nlohmann::json sharding)
    : manifest_(std::move(manifest)), sharding_(std::move(sharding)) {
  LOCKSTEP_CHECK(sharding_.is_object() && sharding_.contains("layout") && sharding_.at("layout").is_object(),
                 manifest_, ": not the manifest of a sharded FSDP checkpoint (no layout)");
  world_size_ = sharding_.value("world_size", -1);
  shard_world_ = layout().value("shard_world_size", -1);
  LOCKSTEP_CHECK(world_size_ >= 1 && shard_world_ >= 1 && world_size_ % shard_world_ == 0, manifest_,
                 ": corrupt manifest: written by ", world_size_, " ranks with ", shard_world_, " per shard group");
  files_.resize(static_cast<size_t>(world_size_));
}

const ShardReader& ShardedCheckpoint::file(int rank) const {
  LOCKSTEP_CHECK(rank >= 0 && rank < world_size_, manifest_, ": no shard file of rank ", rank, " (written by ",
                 world_size_, " ranks)");
  auto& slot = files_[static_cast<size_t>(rank)];
  if (!slot) slot = std::make_unique<ShardReader>(open_shard(manifest_, rank, world_size_));
  return *slot;
}

const ShardReader& ShardedCheckpoint::file_of_shard(int shard_rank) const {
  // Shard groups are runs of consecutive ranks, so rank `shard_rank` is the
  // first holder; any other layout is found by looking.
  if (shard_rank < world_size_ && shard_rank_of(file(shard_rank)) == shard_rank) return file(shard_rank);
  for (int rank = 0; rank < world_size_; ++rank) {
    if (shard_rank_of(file(rank)) == shard_rank) return file(rank);
  }
  LOCKSTEP_FAIL(manifest_, ": no shard file holds shard rank ", shard_rank, " of ", shard_world_);
}

std::vector<StateReader> ShardedCheckpoint::model_parts() const {
  std::vector<StateReader> result;
  for (int s = 0; s < shard_world_; ++s) result.push_back(file_of_shard(s).model);
  return result;
}

std::vector<StateReader> ShardedCheckpoint::optim_wrapper_parts() const {
  std::vector<StateReader> result;
  for (int s = 0; s < shard_world_; ++s) {
    const ShardReader& shard = file_of_shard(s);
    LOCKSTEP_CHECK(shard.optim_wrapper.has_value(), shard.model.source(),
                   ": holds no optimizer state (saved with save_optimizer: false?)");
    result.push_back(*shard.optim_wrapper);
  }
  return result;
}

std::map<std::string, torch::Tensor> ShardedCheckpoint::full_weights() const {
  LOCKSTEP_CHECK(layout().at("units").empty() || layout().at("units").at(0).contains("aliases"),
                 manifest_, ": written by a lockstep that did not record tied parameter names and buffer dtypes in "
                 "a sharded checkpoint, so its whole weights cannot be told exactly; resume it with FSDPStrategy and "
                 "save again (either state_dict_type)");
  const std::vector<StateReader> model = model_parts();
  std::map<std::string, torch::Tensor> weights;
  for (const auto& unit : layout().at("units")) {
    const std::string key = "shards/" + fsdp::unit_key(unit.at("path").get<std::string>());
    const int64_t numel = unit.at("numel").get<int64_t>();
    const int64_t shard_numel = unit.at("padded_numel").get<int64_t>() / shard_world_;
    // The unit whole, each saved piece read once; its parameters are cut from it.
    torch::Tensor flat = torch::empty({numel}, torch::TensorOptions().dtype(model[0].entry(key).dtype));
    fsdp::fill_from_pieces(flat, 0, fsdp::shard_pieces(numel, shard_numel, shard_world_),
                           [&](size_t s, int64_t first, int64_t count) {
                             return fsdp::read_saved_piece(model[s], key, first, count, shard_numel);
                           });
    std::map<std::string, torch::Tensor> by_name;
    for (const auto& param : unit.at("params")) {
      const std::vector<int64_t> shape = param.at(1).get<std::vector<int64_t>>();
      const int64_t offset = param.at(2).get<int64_t>();
      int64_t count = 1;
      for (int64_t d : shape) count *= d;
      LOCKSTEP_CHECK(offset >= 0 && offset + count <= numel, manifest_, ": corrupt layout: parameter ",
                     param.at(0).dump(), " lies outside its unit");
      by_name[param.at(0).get<std::string>()] = flat.narrow(0, offset, count).view(shape).clone();
    }
    const nlohmann::json aliases = unit.at("aliases");
    for (const auto& alias : aliases.items()) weights[alias.key()] = by_name.at(alias.value().get<std::string>());
    weights.insert(by_name.begin(), by_name.end());
  }
  const nlohmann::json buffer_dtypes = layout().value("buffer_dtypes", nlohmann::json::object());
  for (const auto& key : model[0].keys()) {
    for (const std::string prefix : {"frozen/", "buffers/"}) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(prefix.size());
      torch::Tensor value = model[0].read(key);
      if (buffer_dtypes.contains(name)) value = value.to(static_cast<c10::ScalarType>(buffer_dtypes.at(name).get<int>()));
      weights[name] = value;
    }
  }
  return weights;
}

uint64_t ShardedCheckpoint::bytes_read() const {
  uint64_t total = 0;
  for (const auto& file : files_) total += file ? file->model.bytes_read() : 0;  // the file's, every part
  return total;
}

uint64_t ShardedCheckpoint::bytes_in_opened_files() const {
  uint64_t total = 0;
  for (const auto& file : files_) {
    if (!file) continue;
    std::vector<const StateReader*> parts{&file->model};
    if (file->optim_wrapper) parts.push_back(&*file->optim_wrapper);
    for (const StateReader* part : parts) {
      for (const auto& key : part->keys()) {
        const TensorEntry& entry = part->entry(key);
        total += static_cast<uint64_t>(entry.numel()) * c10::elementSize(entry.dtype);
      }
    }
  }
  return total;
}

int ShardedCheckpoint::opened_files() const {
  int count = 0;
  for (const auto& file : files_) count += file ? 1 : 0;
  return count;
}

std::map<std::string, torch::Tensor> whole_model_weights(const CheckpointContents& contents, const std::string& path) {
  if (!contents.sharded()) return model_weights(contents, path);
  if (is_dcp_manifest(contents)) {
    std::map<std::string, torch::Tensor> weights;
    const DcpReader reader(dcp_directory_of(path, contents));
    for (const auto& name : reader.tensor_names()) {
      if (name.rfind("model.", 0) == 0) weights[name.substr(6)] = reader.read(name);
    }
    return weights;
  }
  return ShardedCheckpoint(path, *contents.sharding).full_weights();
}

}  // namespace lockstep
