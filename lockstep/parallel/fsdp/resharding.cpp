// fsdp::Resharding: loading a sharded checkpoint written by another
// number of ranks per shard group (PyTorch's DCP reshards the same way: by
// the saved pieces' places in each parameter).
//
// A unit's flat layout is the same at every world size (the parameters back
// to back; only the padding at its end changes), so each saved shard is a
// known piece of it: shard s of S elements is [s * S, s * S + S). This rank's
// shard is another range of the same layout; it is cut out of the saved
// pieces that overlap it, and only their overlapping elements are read.
// Optimizer state follows the same places: flat shards' buffers are laid out
// as the shards, and use_orig_params' buffers as each parameter's part of
// them; scalar (0-dim) state, such as a step kept as a tensor, is whole in
// every file that holds its parameter and is read from the first (Note [FSDP
// optimizer state of any optimizer], state_dict_codec.cpp). Frozen parameters
// and buffers are whole in every shard file; they are read from the first.
#include <algorithm>
#include <map>
#include <utility>

#include "lockstep/core/error.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/fsdp/internal/resharding.h"
#include "lockstep/parallel/fsdp/flat_layout.h"

namespace lockstep::fsdp {
namespace {

using nlohmann::json;

// The saved shard size of unit `u` of `saved_layout`.
int64_t saved_shard_numel(const json& saved_layout, size_t u) {
  const int64_t shards = saved_layout.at("shard_world_size").get<int64_t>();
  return saved_layout.at("units").at(u).at("padded_numel").get<int64_t>() / shards;
}

void check_saved_count(const json& saved_layout, const std::vector<StateReader>& saved) {
  LOCKSTEP_CHECK(!saved.empty(), "FSDP: resharding needs the saved shards");
  const int saved_shards = saved_layout.at("shard_world_size").get<int>();
  LOCKSTEP_CHECK(static_cast<int>(saved.size()) == saved_shards, saved[0].source(), ": the layout has ", saved_shards,
                 " shards, ", saved.size(), " were opened");
}

// Where an optimizer position lies in its unit's layout, here and in each saved shard.
struct OptimizerPlace {
  int64_t begin = 0;   // this rank's part
  int64_t length = 0;
  int64_t size = 0;    // of this rank's tensor (a flat shard keeps its padding)
  std::vector<LayoutPiece> saved;
};

// Every optimizer position's place: with use_orig_params a parameter's part
// of its unit, else a unit's whole flat shard.
std::map<std::string, OptimizerPlace> optimizer_places(const ShardedModel& model, const StateDictCodec& codec,
                                                       const torch::optim::Optimizer& optimizer,
                                                       const json& saved_layout) {
  const int saved_shards = saved_layout.at("shard_world_size").get<int>();
  std::map<std::string, OptimizerPlace> places;
  if (model.options.use_orig_params()) {
    for (const auto& [position, ref] : codec.orig_positions(optimizer)) {
      const FlatSlot& slot = ref.unit->slots()[ref.slot];
      const ShardOverlap mine = ref.unit->shard_part(ref.slot);
      const int64_t saved_shard = saved_shard_numel(saved_layout, static_cast<size_t>(ref.unit->index()));
      OptimizerPlace place{slot.offset + mine.in_range, mine.length, mine.length, {}};
      for (int s = 0; s < saved_shards; ++s) {
        const ShardOverlap theirs = shard_overlap(slot.offset, slot.numel, s, saved_shard);
        place.saved.push_back({slot.offset + theirs.in_range, theirs.length});
      }
      places[position] = std::move(place);
    }
  } else {
    for (size_t u = 0; u < model.units.size(); ++u) {
      const FlatParamUnit& unit = *model.units[u];
      const LayoutPiece mine = shard_piece(unit.layout().numel, unit.layout().shard_numel, unit.layout().shard_rank);
      places["0." + std::to_string(u)] =
          OptimizerPlace{mine.begin, mine.numel, unit.layout().shard_numel,
                         shard_pieces(unit.layout().numel, saved_shard_numel(saved_layout, u), saved_shards)};
    }
  }
  return places;
}

// What the saved shard files hold of the optimizer state, read from their
// indexes (no tensor is read).
struct SavedOptimizerState {
  json params = json::object();
  std::map<std::string, std::map<std::string, c10::ScalarType>> buffers;  // position -> buffer -> dtype
  std::map<std::string, std::string> found_in;                             // position -> a file holding it
  std::map<std::string, std::pair<size_t, bool>> first_seen;               // key -> (first file holding it, 0-dim)
};

// Per-parameter values (Adam's or Adagrad's step, whatever the optimizer
// keeps): every shard has them for the parameters it holds a part of; with
// use_orig_params a parameter may lie wholly in some shards. A buffer is 0-dim
// in every file or in none.
SavedOptimizerState index_saved_optimizer_state(const std::vector<StateReader>& saved) {
  SavedOptimizerState index;
  for (size_t s = 0; s < saved.size(); ++s) {
    const StateReader& reader = saved[s];
    const json saved_params = reader.values().value("params", json::object());
    for (const auto& item : saved_params.items()) {
      if (!index.params.contains(item.key())) index.params[item.key()] = item.value();
    }
    for (const auto& key : reader.keys()) {
      std::string position, buffer;
      LOCKSTEP_CHECK(split_state_key(key, &position, &buffer), reader.source(), ": optimizer state '", key,
                     "' is not named <group>.<index>.<buffer>");
      const TensorEntry& entry = reader.entry(key);
      const bool is_scalar = entry.shape.empty();
      const auto& first = index.first_seen.emplace(key, std::make_pair(s, is_scalar)).first->second;
      LOCKSTEP_CHECK(first.second == is_scalar, reader.source(), ": optimizer state '", key, "' is ",
                     is_scalar ? "0-dim" : "not 0-dim", " here but ", first.second ? "0-dim" : "not 0-dim", " in ",
                     saved[first.first].source());
      index.buffers[position].emplace(buffer, entry.dtype);
      index.found_in.emplace(position, reader.source());
    }
  }
  return index;
}

}  // namespace

State Resharding::state_dict(const json& saved_layout,
                                                     const std::vector<StateReader>& saved) const {
  check_saved_count(saved_layout, saved);
  const int saved_shards = saved_layout.at("shard_world_size").get<int>();
  codec_.check_units_fit(saved_layout, saved[0].source(), /*same_shard_world=*/false);
  torch::NoGradGuard no_grad;
  State state;
  for (size_t u = 0; u < model_.units.size(); ++u) {
    const FlatParamUnit& unit = *model_.units[u];
    const std::string key = "shards/" + unit_key(unit.path());
    const int64_t saved_shard = saved_shard_numel(saved_layout, u);
    torch::Tensor shard =
        torch::zeros({unit.layout().shard_numel}, torch::TensorOptions().dtype(unit.shard().scalar_type()));
    const LayoutPiece mine = shard_piece(unit.layout().numel, unit.layout().shard_numel, unit.layout().shard_rank);
    fill_from_pieces(shard.narrow(0, 0, mine.numel), mine.begin,
                           shard_pieces(unit.layout().numel, saved_shard, saved_shards),
                           [&](size_t s, int64_t first, int64_t count) {
                             return read_saved_piece(saved[s], key, first, count, saved_shard);
                           });
    state.tensors[key] = shard;
  }
  for (const auto& [name, tensor] : model_.frozen) state.tensors["frozen/" + name] = saved[0].read("frozen/" + name);
  for (const auto& [name, tensor] : model_.buffers) state.tensors["buffers/" + name] = saved[0].read("buffers/" + name);
  state.values["layout"] = codec_.layout();
  state.values["shard_rank"] = model_.shard_group ? model_.shard_group->rank() : 0;
  return state;
}

State Resharding::optimizer_state(const torch::optim::Optimizer& optimizer,
                                                          const json& saved_layout,
                                                          const std::vector<StateReader>& saved) const {
  check_saved_count(saved_layout, saved);
  codec_.check_units_fit(saved_layout, saved[0].source(), /*same_shard_world=*/false);
  const std::map<std::string, OptimizerPlace> places = optimizer_places(model_, codec_, optimizer, saved_layout);
  const SavedOptimizerState index = index_saved_optimizer_state(saved);
  State local;
  local.values = saved[0].values();
  local.values["params"] = index.params;
  torch::NoGradGuard no_grad;
  for (const auto& [position, names] : index.buffers) {
    auto found = places.find(position);
    LOCKSTEP_CHECK(found != places.end(), index.found_in.at(position), ": the optimizer state has parameter position ",
                   position, " but this run's optimizer has ", places.size(),
                   " positions (another model, wrap policy or paramwise_cfg?)");
    const OptimizerPlace& place = found->second;
    for (const auto& [buffer, dtype] : names) {
      const std::string key = position + "." + buffer;
      const std::pair<size_t, bool>& seen = index.first_seen.at(key);
      if (seen.second) {  // a scalar: whole, as saved
        local.tensors[key] = saved[seen.first].read(key);
        continue;
      }
      torch::Tensor value = torch::zeros({place.size}, torch::TensorOptions().dtype(dtype));
      fill_from_pieces(value.narrow(0, 0, place.length), place.begin, place.saved,
                             [&](size_t s, int64_t first, int64_t count) {
                               return read_saved_piece(saved[s], key, first, count);
                             });
      local.tensors[key] = value;
    }
  }
  return local;
}

}  // namespace lockstep::fsdp
