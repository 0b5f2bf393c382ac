#include "lockstep/parallel/fsdp/internal/state_dict_codec.h"

// fsdp::StateDictCodec: state dicts. Full ones are gathered unit by unit
// (one unit's full-precision flat parameter at a time); sharded ones are each
// rank's shards as they are, with the layout that must match on loading.
#include <functional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "lockstep/core/error.h"
#include "lockstep/core/load_report.h"
#include "lockstep/core/shape_text.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/fsdp/flat_layout.h"

namespace lockstep::fsdp {
namespace {

using nlohmann::json;

// Note [FSDP optimizer state of any optimizer]
// The optimizer state a conversion below sees holds, per parameter position,
// values (Adam's or Adagrad's step: merged as they are, a unit's from its
// first parameter's) and tensors of two kinds (optim/optimizer_state.h):
// per-element buffers laid out as their parameter (exp_avg, sum), sliced
// and gathered as the parameters are; and scalars, 0-dim tensors (a step kept
// as a tensor), which every piece of a parameter shares and which are copied
// as they are, like the values. In a sharded state every per-element buffer
// is 1-D (flat shards and use_orig_params' views are), so 0-dim means scalar.
// In a full state a 0-dim parameter's buffers are 0-dim too, so a buffer name
// is a scalar when it is 0-dim for some parameter that is not (a model whose
// every parameter with that buffer is 0-dim has it taken as per-element).

// The buffer names of `full` that are scalars; `slot_at` gives the slot of a
// position (nullptr: none).
std::set<std::string> scalar_state_buffers(const State& full,
                                           const std::function<const FlatSlot*(const std::string&)>& slot_at) {
  std::set<std::string> scalars;
  for (const auto& [key, value] : full.tensors) {
    std::string position, buffer;
    if (!split_state_key(key, &position, &buffer) || value.dim() != 0) continue;
    const FlatSlot* slot = slot_at(position);
    if (slot != nullptr && !slot->shape.empty()) scalars.insert(buffer);
  }
  return scalars;
}

}  // namespace

std::map<std::string, torch::Tensor> StateDictCodec::full_state_dict(bool rank0_only) {
  torch::NoGradGuard no_grad;
  const bool keep = !rank0_only || model_.group->rank() == 0;
  std::map<std::string, torch::Tensor> weights;
  for (const auto& unit : model_.units) {
    torch::Tensor flat = unit->gather_in_full_layout(unit->shard());
    if (!keep) continue;
    for (const auto& slot : unit->slots()) {
      torch::Tensor value = flat.narrow(0, slot.offset, slot.numel).view(slot.shape).to(torch::kCPU).clone();
      weights[slot.name] = value;
      for (const auto& alias : slot.aliases) weights[alias] = value;
    }
  }
  if (!keep) return weights;
  for (const auto& [name, tensor] : model_.frozen) weights[name] = tensor.detach().to(torch::kCPU).clone();
  // Buffers in their own dtype (mixed precision's buffer_dtype is for training only), as PyTorch's FSDP.
  for (const auto& [name, tensor] : model_.buffers) {
    weights[name] =
        tensor.detach().to(torch::kCPU, model_.buffer_dtypes.at(name), /*non_blocking=*/false, /*copy=*/true);
  }
  return weights;
}

LoadReport StateDictCodec::load_full_state_dict(const std::map<std::string, torch::Tensor>& weights,
                                                           bool strict, const std::string& source) {
  LoadReport report;
  std::set<std::string> seen;
  // Finds a tensor by any of its names and checks its shape; nullptr if unusable.
  auto lookup = [&](const std::string& name, const std::vector<std::string>& aliases,
                    c10::IntArrayRef shape) -> const torch::Tensor* {
    const torch::Tensor* found = nullptr;
    std::string found_name;
    std::vector<std::string> names{name};
    names.insert(names.end(), aliases.begin(), aliases.end());
    for (const auto& candidate : names) {
      seen.insert(candidate);
      auto it = weights.find(candidate);
      if (found == nullptr && it != weights.end()) {
        found = &it->second;
        found_name = it->first;
      }
    }
    if (found == nullptr) {
      report.missing.push_back(name);
      return nullptr;
    }
    if (found->sizes() != shape) {
      report.mismatched.push_back(found_name + ": " + source + " has " + shape_text(found->sizes()) +
                                  ", the model has " + shape_text(shape));
      return nullptr;
    }
    return found;
  };
  std::vector<std::pair<FlatParamUnit*, const FlatSlot*>> slot_targets;
  std::vector<const torch::Tensor*> slot_values;
  for (const auto& unit : model_.units) {
    for (const auto& slot : unit->slots()) {
      const torch::Tensor* value = lookup(slot.name, slot.aliases, slot.shape);
      if (value != nullptr) {
        slot_targets.emplace_back(unit.get(), &slot);
        slot_values.push_back(value);
      }
    }
  }
  std::vector<std::pair<torch::Tensor, const torch::Tensor*>> plain;
  for (const auto* list : {&model_.frozen, &model_.buffers}) {
    for (const auto& [name, tensor] : *list) {
      if (const torch::Tensor* value = lookup(name, {}, tensor.sizes())) plain.emplace_back(tensor, value);
    }
  }
  for (const auto& entry : weights) {
    if (seen.count(entry.first) == 0) report.unexpected.push_back(entry.first);
  }
  LOCKSTEP_CHECK(report.clean() || !strict, "cannot load the model weights from ", source,
                 " (is it a checkpoint of another model?):\n", report.describe(source));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < slot_targets.size(); ++i) {
    auto* unit = slot_targets[i].first;
    unit->load_slice(slot_targets[i].second->offset, slot_values[i]->to(unit->shard().options().requires_grad(false)));
  }
  for (auto& [tensor, value] : plain) {
    torch::Tensor target = tensor;
    target.copy_(*value);
  }
  for (auto& unit : model_.units) unit->mark_shard_updated();  // refreshed by shards_changed(), a collective
  return report;
}

json StateDictCodec::layout() const {
  json units = json::array();
  for (const auto& unit : model_.units) {
    json params = json::array();
    json aliases = json::object();  // tied parameters' further names -> the slot's name
    for (const auto& slot : unit->slots()) {
      params.push_back({slot.name, slot.shape, slot.offset});
      for (const auto& alias : slot.aliases) aliases[alias] = slot.name;
    }
    units.push_back({{"path", unit->path()},
                     {"numel", unit->layout().numel},
                     {"padded_numel", unit->layout().padded_numel},
                     {"dtype", c10::toString(unit->shard().scalar_type())},
                     {"params", params},
                     {"aliases", aliases}});
  }
  // Buffers that train in another dtype (mixed precision's buffer_dtype) are
  // saved so; a full export gives them back their own.
  json buffer_dtypes = json::object();
  for (const auto& [name, tensor] : model_.buffers) {
    const torch::Dtype own = model_.buffer_dtypes.at(name);
    if (own != tensor.scalar_type()) buffer_dtypes[name] = static_cast<int>(own);
  }
  return {{"world_size", model_.group->size()},
          {"shard_world_size", model_.shard_group ? model_.shard_group->size() : 1},
          {"sharding_strategy", to_string(model_.options.sharding_strategy())},
          {"use_orig_params", model_.options.use_orig_params()},
          {"per_parameter", model_.options.per_parameter_sharding()},
          {"units", units},
          {"buffer_dtypes", buffer_dtypes}};
}

State StateDictCodec::sharded_state_dict() const {
  State state;
  for (const auto& unit : model_.units) state.tensors["shards/" + unit_key(unit->path())] = unit->shard().detach();
  for (const auto& [name, tensor] : model_.frozen) state.tensors["frozen/" + name] = tensor.detach();
  for (const auto& [name, tensor] : model_.buffers) state.tensors["buffers/" + name] = tensor.detach();
  state.values["layout"] = layout();
  state.values["shard_rank"] = model_.shard_group ? model_.shard_group->rank() : 0;
  return state;
}

void StateDictCodec::check_units_fit(const json& saved, const std::string& source,
                                               bool same_shard_world) const {
  const json mine = layout();
  auto differs = [&](const std::string& what) {
    return str_cat(source, ": this sharded checkpoint does not fit the model as wrapped now: ", what,
                   ". A sharded checkpoint loads only into the same model and wrap policy",
                   same_shard_world ? " and number of ranks per shard group" : "",
                   "; save with state_dict_type: full to move between layouts.");
  };
  if (same_shard_world) {
    LOCKSTEP_CHECK(saved.at("shard_world_size") == mine.at("shard_world_size"),
                   differs(str_cat("it was saved with ", saved.at("shard_world_size").dump(),
                                   " rank(s) per shard group (", saved.at("world_size").dump(), " in all, ",
                                   saved.at("sharding_strategy").get<std::string>(), ") and this run has ",
                                   mine.at("shard_world_size").dump(), " (", mine.at("world_size").dump(), " in all, ",
                                   mine.at("sharding_strategy").get<std::string>(), ")")));
  }
  const bool saved_per_parameter = saved.value("per_parameter", false);
  LOCKSTEP_CHECK(saved_per_parameter == model_.options.per_parameter_sharding(),
                 differs(str_cat("it holds ", saved_per_parameter ? "FullyShard's per-parameter" : "FSDP1's flat",
                                 " shards and this run wraps with ",
                                 model_.options.per_parameter_sharding() ? "FullyShard" : "FSDP1")));
  LOCKSTEP_CHECK(same_shard_world || !saved_per_parameter,
                 differs("FullyShard's per-parameter shards load at the number of ranks that saved them only"));
  const json& saved_units = saved.at("units");
  const json& my_units = mine.at("units");
  for (size_t u = 0; u < std::min(saved_units.size(), my_units.size()); ++u) {
    const json& a = saved_units[u];
    const json& b = my_units[u];
    LOCKSTEP_CHECK(a.at("path") == b.at("path"), differs(str_cat("unit #", u, " is '", a.at("path").get<std::string>(),
                                                                 "' in the checkpoint but '",
                                                                 b.at("path").get<std::string>(), "' here")));
    const std::string where = str_cat("unit '", b.at("path").get<std::string>(), "'");
    LOCKSTEP_CHECK(a.at("dtype") == b.at("dtype"), differs(str_cat(where, " is ", a.at("dtype").get<std::string>(),
                                                                   " in the checkpoint but ",
                                                                   b.at("dtype").get<std::string>(), " here")));
    const json& pa = a.at("params");
    const json& pb = b.at("params");
    for (size_t i = 0; i < std::min(pa.size(), pb.size()); ++i) {
      LOCKSTEP_CHECK(pa[i] == pb[i], differs(str_cat(where, " parameter #", i, " is ", pa[i].dump(),
                                                     " in the checkpoint but ", pb[i].dump(),
                                                     " here ([name, shape, offset])")));
    }
    LOCKSTEP_CHECK(pa.size() == pb.size(), differs(str_cat(where, " holds ", pa.size(),
                                                           " parameters in the checkpoint but ", pb.size(), " here")));
  }
  LOCKSTEP_CHECK(saved_units.size() == my_units.size(),
                 differs(str_cat("it has ", saved_units.size(), " units and this model ", my_units.size())));
}

void StateDictCodec::load_sharded_state_dict(const State& state, const std::string& source) {
  LOCKSTEP_CHECK(state.values.is_object() && state.values.contains("layout"), source,
                 ": holds no FSDP layout; is it a sharded FSDP checkpoint?");
  check_units_fit(state.values.at("layout"), source, /*same_shard_world=*/true);
  const int my_shard_rank = model_.shard_group ? model_.shard_group->rank() : 0;
  LOCKSTEP_CHECK(state.values.value("shard_rank", -1) == my_shard_rank, source, ": holds the shards of shard rank ",
                 state.values.value("shard_rank", -1), " but this is shard rank ", my_shard_rank);

  torch::NoGradGuard no_grad;
  for (auto& unit : model_.units) {
    const torch::Tensor& value = state.tensor("shards/" + unit_key(unit->path()), source);
    LOCKSTEP_CHECK(value.numel() == unit->layout().shard_numel, source, ": shard of unit '", unit->path(), "' has ",
                   value.numel(), " elements, expected ", unit->layout().shard_numel);
    torch::Tensor shard = unit->shard();
    shard.detach().copy_(value.reshape(-1));
  }
  auto load_plain = [&](const std::string& prefix, std::vector<std::pair<std::string, torch::Tensor>>& list) {
    for (auto& [name, tensor] : list) {
      const torch::Tensor& value = state.tensor(prefix + name, source);
      LOCKSTEP_CHECK(value.sizes() == tensor.sizes(), source, ": ", name, " has shape ", shape_text(value.sizes()),
                     " but the model's is ", shape_text(tensor.sizes()));
      tensor.detach().copy_(value);
    }
  };
  load_plain("frozen/", model_.frozen);
  load_plain("buffers/", model_.buffers);
  // Every gathered unit is stale now; shards_changed() gathers them again (a collective).
  for (auto& unit : model_.units) unit->mark_shard_updated();
}

State StateDictCodec::full_flat_optimizer_state(const State& sharded, bool rank0_only) {
  const json& groups = sharded.values.at("groups");
  LOCKSTEP_CHECK(groups.size() == 1, "FSDP: converting optimizer state needs one parameter group, this optimizer has ",
                 groups.size());
  const bool keep = !rank0_only || model_.group->rank() == 0;
  State full;
  full.values["type"] = sharded.values.at("type");
  full.values["groups"] = json::array({{{"num_params", model_.trainable_count}, {"options", groups[0].at("options")}}});
  json params = json::object();
  const json& saved_params = sharded.values.at("params");
  // Buffers by unit position, from the (rank-identical) key set.
  std::map<std::string, std::vector<std::string>> buffers;
  for (const auto& entry : sharded.tensors) {
    std::string position, buffer;
    if (split_state_key(entry.first, &position, &buffer)) buffers[position].push_back(buffer);
  }
  for (const auto& unit : model_.units) {
    const std::string position = "0." + std::to_string(unit->index());
    if (saved_params.contains(position)) {
      for (const auto& slot : unit->slots())
        params["0." + std::to_string(slot.model_index)] = saved_params.at(position);
    }
    for (const auto& buffer : buffers[position]) {
      const torch::Tensor& local = sharded.tensors.at(position + "." + buffer);
      if (local.dim() == 0) {  // a scalar: every parameter's (Note [FSDP optimizer state of any optimizer])
        if (!keep) continue;
        for (const auto& slot : unit->slots()) {
          full.tensors["0." + std::to_string(slot.model_index) + "." + buffer] = local.detach().to(torch::kCPU).clone();
        }
        continue;
      }
      // Every rank holds the same shapes, so all or none stop here, before the collective.
      const int64_t shard_numel = unit->layout().shard_numel;
      LOCKSTEP_CHECK(local.dim() == 1 && local.numel() == shard_numel, "FSDP: optimizer state '", position, ".", buffer,
                     "' of unit '", unit->path(), "' has shape ", shape_text(local.sizes()),
                     ", neither the flat shard's [", shard_numel, "] nor a scalar's []: FSDP can gather only buffers "
                     "laid out as the parameters, and 0-dim ones");
      torch::Tensor flat = unit->gather_in_full_layout(local);
      if (!keep) continue;
      for (const auto& slot : unit->slots()) {
        full.tensors["0." + std::to_string(slot.model_index) + "." + buffer] =
            flat.narrow(0, slot.offset, slot.numel).view(slot.shape).to(torch::kCPU).clone();
      }
    }
  }
  full.values["params"] = params;
  if (!keep) return State();
  full.values["param_names"] = flat_position_names();
  return full;
}

State StateDictCodec::shard_flat_optimizer_state(const State& full) const {
  const json& groups = full.values.at("groups");
  LOCKSTEP_CHECK(groups.size() == 1, "FSDP: optimizer state with ", groups.size(),
                 " parameter groups cannot be sharded (FSDP's optimizer has one group)");
  const int64_t count = groups[0].at("num_params").get<int64_t>();
  LOCKSTEP_CHECK(count == model_.trainable_count, "FSDP: the optimizer state is for ", count,
                 " parameters but the model has ", model_.trainable_count, " trainable parameters");
  std::map<int64_t, std::vector<std::pair<std::string, torch::Tensor>>> by_param;
  for (const auto& entry : full.tensors) {
    std::string position, buffer;
    if (!split_state_key(entry.first, &position, &buffer)) continue;
    by_param[std::stoll(position.substr(2))].emplace_back(buffer, entry.second);
  }
  std::map<std::string, const FlatSlot*> slots;
  for (const auto& unit : model_.units) {
    for (const auto& slot : unit->slots()) slots["0." + std::to_string(slot.model_index)] = &slot;
  }
  const std::set<std::string> scalars = scalar_state_buffers(full, [&](const std::string& position) {
    auto found = slots.find(position);
    return found == slots.end() ? nullptr : found->second;
  });
  State sharded;
  sharded.values["type"] = full.values.at("type");
  sharded.values["groups"] = json::array({{{"num_params", model_.units.size()}, {"options", groups[0].at("options")}}});
  json params = json::object();
  const json& saved_params = full.values.at("params");
  torch::NoGradGuard no_grad;
  for (const auto& unit : model_.units) {
    const std::string position = "0." + std::to_string(unit->index());
    std::map<std::string, torch::Tensor> flats;
    for (const auto& slot : unit->slots()) {
      const std::string param_position = "0." + std::to_string(slot.model_index);
      if (saved_params.contains(param_position) && !params.contains(position)) {
        params[position] = saved_params.at(param_position);
      }
      for (const auto& [buffer, value] : by_param[slot.model_index]) {
        if (scalars.count(buffer)) {  // the unit's is its first parameter's, as for the values
          LOCKSTEP_CHECK(value.dim() == 0, "FSDP: optimizer state '", param_position, ".", buffer, "' of ", slot.name,
                         " has shape ", shape_text(value.sizes()), " but is a scalar (0-dim) for other parameters");
          if (!sharded.tensors.count(position + "." + buffer)) sharded.tensors[position + "." + buffer] = value.clone();
          continue;
        }
        LOCKSTEP_CHECK(value.numel() == slot.numel, "FSDP: optimizer state '", param_position, ".", buffer, "' of ",
                       slot.name, " has shape ", shape_text(value.sizes()), ", the parameter has ",
                       shape_text(slot.shape));
        auto& flat = flats[buffer];
        if (!flat.defined()) flat = torch::zeros({unit->layout().padded_numel}, value.options());
        flat.narrow(0, slot.offset, slot.numel).copy_(value.reshape(-1));
      }
    }
    for (auto& [buffer, flat] : flats) {
      sharded.tensors[position + "." + buffer] = unit->layout().shard_of(flat).clone();
    }
  }
  sharded.values["params"] = params;
  return sharded;
}

// --- optimizer state over the original parameters (use_orig_params) --------

std::map<std::string, SlotRef> StateDictCodec::orig_positions(
    const torch::optim::Optimizer& optimizer) const {
  std::unordered_map<const void*, SlotRef> by_tensor;
  for (const auto& unit : model_.units) {
    for (size_t s = 0; s < unit->gradients().orig_params().size(); ++s) {
      by_tensor[unit->gradients().orig_params()[s].unsafeGetTensorImpl()] = SlotRef{unit.get(), s};
    }
  }
  std::map<std::string, SlotRef> positions;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      auto found = by_tensor.find(groups[g].params()[i].unsafeGetTensorImpl());
      LOCKSTEP_CHECK(found != by_tensor.end(), "FSDP (use_orig_params): parameter #", i, " of the optimizer's group ",
                     g, " is none of named_orig_parameters(); build the optimizer over those");
      positions.emplace(std::to_string(g) + "." + std::to_string(i), found->second);
    }
  }
  return positions;
}

json StateDictCodec::flat_position_names() const {
  json names = json::object();
  for (const auto& unit : model_.units) {
    for (const auto& slot : unit->slots()) {
      if (slot.trainable) names["0." + std::to_string(slot.model_index)] = slot.name;
    }
  }
  return names;
}

json StateDictCodec::orig_position_names(const std::map<std::string, SlotRef>& positions) {
  json names = json::object();
  for (const auto& [position, ref] : positions) names[position] = ref.unit->slots()[ref.slot].name;
  return names;
}

State StateDictCodec::full_orig_optimizer_state(const torch::optim::Optimizer& optimizer,
                                                          const State& local, bool rank0_only) {
  const auto positions = orig_positions(optimizer);
  const bool keep = !rank0_only || model_.group->rank() == 0;
  // Every rank gathers the same buffers, in the same order and dtype: the
  // union of what each rank holds per position (position -> [[buffer, dtype,
  // scalar]]; all ranks hold the same in practice). Scalars are not gathered:
  // the kept rank's are copied (Note [FSDP optimizer state of any optimizer]).
  json mine = json::object();
  for (const auto& entry : local.tensors) {
    std::string position, buffer;
    if (split_state_key(entry.first, &position, &buffer)) {
      mine[position].push_back({buffer, static_cast<int>(entry.second.scalar_type()), entry.second.dim() == 0});
    }
  }
  std::map<std::string, std::set<std::string>> buffers;
  std::map<std::string, torch::ScalarType> dtypes;  // by buffer name
  std::map<std::string, bool> scalar;               // by buffer name
  for (const json& theirs : all_gather_object(mine, model_.group)) {
    for (const auto& item : theirs.items()) {
      for (const auto& entry : item.value()) {
        const std::string buffer = entry[0].get<std::string>();
        const bool is_scalar = entry[2].get<bool>();
        // Decided from the gathered lists, so every rank fails alike.
        LOCKSTEP_CHECK(scalar.emplace(buffer, is_scalar).first->second == is_scalar, "FSDP: optimizer state '",
                       buffer, "' is 0-dim for some parameters and not for others: FSDP can gather only "
                       "buffers laid out as the parameters, and 0-dim ones");
        if (is_scalar) continue;
        buffers[item.key()].insert(buffer);
        dtypes.emplace(buffer, static_cast<torch::ScalarType>(entry[1].get<int>()));
      }
    }
  }
  State full;
  full.values = local.values;
  full.values["param_names"] = orig_position_names(positions);
  torch::NoGradGuard no_grad;
  for (const auto& unit : model_.units) {
    // This unit's buffers, each as a shard laid out like the flat parameter.
    std::map<std::string, torch::Tensor> pieces;
    for (const auto& [position, ref] : positions) {
      if (ref.unit != unit.get()) continue;
      for (const auto& buffer : buffers[position]) {
        auto found = local.tensors.find(position + "." + buffer);
        auto& piece = pieces[buffer];
        if (!piece.defined()) {
          piece = torch::zeros({unit->layout().shard_numel},
                               unit->shard().options().dtype(dtypes.at(buffer)).requires_grad(false));
        }
        const ShardOverlap part = unit->shard_part(ref.slot);
        if (found != local.tensors.end() && part.length > 0) {
          piece.narrow(0, part.in_shard, part.length).copy_(found->second.reshape(-1));
        }
      }
    }
    for (const auto& [buffer, piece] : pieces) {
      torch::Tensor flat = unit->gather_in_full_layout(piece);
      if (!keep) continue;
      for (const auto& [position, ref] : positions) {
        if (ref.unit != unit.get() || buffers[position].count(buffer) == 0) continue;
        const FlatSlot& slot = unit->slots()[ref.slot];
        full.tensors[position + "." + buffer] =
            flat.narrow(0, slot.offset, slot.numel).view(slot.shape).to(torch::kCPU).clone();
      }
    }
  }
  if (!keep) return State();
  for (const auto& [key, value] : local.tensors) {
    if (value.dim() == 0) full.tensors[key] = value.detach().to(torch::kCPU).clone();
  }
  return full;
}

State StateDictCodec::shard_orig_optimizer_state(const torch::optim::Optimizer& optimizer,
                                                           const State& full) const {
  const auto positions = orig_positions(optimizer);
  const std::set<std::string> scalars = scalar_state_buffers(full, [&](const std::string& position) {
    auto found = positions.find(position);
    return found == positions.end() ? nullptr : &found->second.unit->slots()[found->second.slot];
  });
  State local;
  local.values = full.values;
  local.values.erase("param_names");
  torch::NoGradGuard no_grad;
  for (const auto& [key, value] : full.tensors) {
    std::string position, buffer;
    if (!split_state_key(key, &position, &buffer)) {
      local.tensors[key] = value;
      continue;
    }
    auto found = positions.find(position);
    LOCKSTEP_CHECK(found != positions.end(), "FSDP: the optimizer state has '", key, "' but the optimizer has no "
                   "parameter at position ", position, " (", positions.size(), " parameters in all)");
    const FlatParamUnit& unit = *found->second.unit;
    const FlatSlot& slot = unit.slots()[found->second.slot];
    if (scalars.count(buffer)) {  // whole on every rank (Note [FSDP optimizer state of any optimizer])
      LOCKSTEP_CHECK(value.dim() == 0, "FSDP: optimizer state '", key, "' of ", slot.name, " has shape ",
                     shape_text(value.sizes()), " but is a scalar (0-dim) for other parameters");
      local.tensors[key] = value.clone();
      continue;
    }
    LOCKSTEP_CHECK(value.numel() == slot.numel, "FSDP: optimizer state '", key, "' of ", slot.name, " has shape ",
                   shape_text(value.sizes()), ", the parameter has ", shape_text(slot.shape));
    const ShardOverlap part = unit.shard_part(found->second.slot);
    local.tensors[key] = value.reshape(-1).narrow(0, part.in_range, part.length).clone();
  }
  return local;
}

State StateDictCodec::full_optimizer_state(const torch::optim::Optimizer& optimizer, const State& local,
                                                     bool rank0_only) {
  return model_.options.use_orig_params() ? full_orig_optimizer_state(optimizer, local, rank0_only)
                                    : full_flat_optimizer_state(local, rank0_only);
}

State StateDictCodec::shard_optimizer_state(const torch::optim::Optimizer& optimizer,
                                                      const State& full) const {
  // A checkpoint that names its positions must name the same parameters here.
  if (full.values.contains("param_names")) {
    const json mine =
        model_.options.use_orig_params() ? orig_position_names(orig_positions(optimizer)) : flat_position_names();
    for (const auto& item : full.values.at("param_names").items()) {
      if (!mine.contains(item.key())) continue;
      LOCKSTEP_CHECK(mine.at(item.key()) == item.value(), "FSDP: the optimizer state's parameter at position ",
                     item.key(), " is ", item.value().dump(), " in the checkpoint but ", mine.at(item.key()).dump(),
                     " in this run: the optimizer's parameter groups differ (another paramwise_cfg or model?)");
    }
  }
  return model_.options.use_orig_params() ? shard_orig_optimizer_state(optimizer, full)
                                          : shard_flat_optimizer_state(full);
}

}  // namespace lockstep::fsdp
