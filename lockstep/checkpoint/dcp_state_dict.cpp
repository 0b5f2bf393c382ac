#include "lockstep/checkpoint/dcp_state_dict.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "lockstep/core/error.h"
#include "lockstep/optim/optimizer_state.h"
#include "lockstep/parallel/fsdp/flat_layout.h"

namespace lockstep {
namespace dcp_state {
namespace {

using nlohmann::json;
using Part = FullyShardedDataParallel::LocalPart;

constexpr char kModel[] = "model";
constexpr char kOptim[] = "optim";

// Note [PyTorch's param_group keys]
// dcp.load fills the state dict it is given and fails on any key the
// checkpoint lacks, and get_optimizer_state_dict gives every key of
// torch.optim's param_groups, including flags lockstep's optimizers have no
// options for (they step as the flags' defaults say). So a checkpoint that
// PyTorch loads holds them all: here PyTorch 2.14's keys per type, in its
// order, with the values lockstep steps with (its options) or PyTorch's
// defaults (the flags). Reading, only lockstep's options are taken.
const std::vector<std::pair<std::string, json>>& pytorch_group_keys(const std::string& type) {
  static const std::map<std::string, std::vector<std::pair<std::string, json>>> keys{
      {"Adam",
       {{"lr", nullptr}, {"betas", nullptr}, {"eps", nullptr}, {"weight_decay", nullptr}, {"amsgrad", nullptr},
        {"maximize", false}, {"foreach", nullptr}, {"capturable", false}, {"differentiable", false},
        {"fused", nullptr}, {"decoupled_weight_decay", false}}},
      {"AdamW",
       {{"lr", nullptr}, {"betas", nullptr}, {"eps", nullptr}, {"weight_decay", nullptr}, {"amsgrad", nullptr},
        {"maximize", false}, {"foreach", nullptr}, {"capturable", false}, {"differentiable", false},
        {"fused", nullptr}, {"decoupled_weight_decay", true}}},
      {"SGD",
       {{"lr", nullptr}, {"momentum", nullptr}, {"dampening", nullptr}, {"weight_decay", nullptr},
        {"nesterov", nullptr}, {"maximize", false}, {"foreach", nullptr}, {"differentiable", false},
        {"fused", nullptr}}},
      {"RMSprop",
       {{"lr", nullptr}, {"momentum", nullptr}, {"alpha", nullptr}, {"eps", nullptr}, {"centered", nullptr},
        {"weight_decay", nullptr}, {"capturable", false}, {"foreach", nullptr}, {"maximize", false},
        {"differentiable", false}}}};
  auto found = keys.find(type);
  LOCKSTEP_CHECK(found != keys.end(), "DCP checkpoints hold the state of SGD, Adam, AdamW and RMSprop, named as "
                 "PyTorch names it; this optimizer is ", type);
  return found->second;
}

// A JSON option as the Python object torch.optim keeps: a list ([b1, b2]) is a tuple.
c10::IValue python_value(const json& value) {
  if (value.is_null()) return c10::IValue();
  if (value.is_boolean()) return c10::IValue(value.get<bool>());
  if (value.is_number_integer()) return c10::IValue(value.get<int64_t>());
  if (value.is_number()) return c10::IValue(value.get<double>());
  if (value.is_string()) return c10::IValue(value.get<std::string>());
  LOCKSTEP_CHECK(value.is_array(), "DCP checkpoint: an optimizer option ", value.dump(), " has no Python form");
  std::vector<c10::IValue> items;
  for (const auto& item : value) items.push_back(python_value(item));
  return c10::ivalue::Tuple::create(std::move(items));
}

// And back: numbers, booleans, None, and tuples or lists of them.
json json_value(const PickleValue& value, const std::string& where) {
  using Kind = PickleValue::Kind;
  switch (value.kind) {
    case Kind::kNone: return nullptr;
    case Kind::kBool: return value.boolean;
    case Kind::kInt: return value.integer;
    case Kind::kFloat: return value.real;
    case Kind::kString: return value.text;
    case Kind::kTuple:
    case Kind::kList: {
      json items = json::array();
      for (const PickleValue* item : value.items) items.push_back(json_value(*item, where));
      return items;
    }
    default: LOCKSTEP_FAIL(where, ": holds ", value.describe(), ", not an optimizer option");
  }
}

int64_t volume(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t size : sizes) n *= size;
  return n;
}

// `flat`, this rank's elements [begin, begin + numel) of a tensor of `shape`, as boxes.
void add_boxes(DcpRankPart& out, const DcpPath& path, const std::vector<int64_t>& shape, int64_t begin,
               const torch::Tensor& flat) {
  for (const DcpBox& box : dcp_boxes_of_range(shape, begin, flat.numel())) {
    out.tensors.push_back({path, shape, box.offsets, flat.narrow(0, box.flat_begin, volume(box.sizes)).view(box.sizes)});
  }
}

// Reads the elements [begin, begin + flat.numel()) of `name` into `flat`.
void read_boxes(const DcpReader& reader, const std::string& name, const std::vector<int64_t>& shape, int64_t begin,
                torch::Tensor flat) {
  const std::vector<int64_t>& saved = reader.size(name);
  LOCKSTEP_CHECK(saved == shape, reader.dir(), ": '", name, "' has size ", c10::IntArrayRef(saved), " there and ",
                 c10::IntArrayRef(shape), " here: not a checkpoint of this model");
  for (const DcpBox& box : dcp_boxes_of_range(shape, begin, flat.numel())) {
    flat.narrow(0, box.flat_begin, volume(box.sizes)).copy_(reader.read_box(name, box.offsets, box.sizes).reshape(-1));
  }
}

// The local part each optimizer position "<g>.<i>" steps.
std::map<std::string, const Part*> parts_by_position(const torch::optim::Optimizer& optimizer,
                                                     const std::vector<Part>& parts) {
  std::unordered_map<const void*, const Part*> by_leaf;
  for (const Part& part : parts) {
    if (part.leaf.defined()) by_leaf[part.leaf.unsafeGetTensorImpl()] = &part;
  }
  std::map<std::string, const Part*> positions;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      auto found = by_leaf.find(groups[g].params()[i].unsafeGetTensorImpl());
      LOCKSTEP_CHECK(found != by_leaf.end(), "DCP checkpoint: parameter #", i, " of the optimizer's group ", g,
                     " is none of the model's parameters (under FSDP: of its named_orig_parameters(); build the "
                     "optimizer over those: FullyShard, or use_orig_params: true)");
      positions.emplace(std::to_string(g) + "." + std::to_string(i), found->second);
    }
  }
  return positions;
}

DcpPath state_path(const std::string& name, const std::string& buffer) {
  return json::array({kOptim, "state", name, buffer});
}

void add_optimizer(DcpRankPart& out, const torch::optim::Optimizer& optimizer, const std::vector<Part>& parts,
                   bool main_rank) {
  const State state = save_optimizer_state(optimizer);
  const std::string type = state.values.at("type").get<std::string>();
  const auto& keys = pytorch_group_keys(type);
  const auto positions = parts_by_position(optimizer, parts);
  for (const auto& [key, tensor] : state.tensors) {
    std::string position, buffer;
    LOCKSTEP_CHECK(fsdp::split_state_key(key, &position, &buffer), "DCP checkpoint: optimizer state '", key,
                   "' is not <group>.<index>.<buffer>");
    const Part& part = *positions.at(position);
    if (tensor.dim() == 0) {
      if (main_rank) out.tensors.push_back({state_path(part.name, buffer), {}, {}, tensor.detach()});
      continue;
    }
    LOCKSTEP_CHECK(tensor.numel() == part.values.numel(), "DCP checkpoint: optimizer state '", buffer, "' of ",
                   part.name, " holds ", tensor.numel(), " elements, its parameter's part ", part.values.numel());
    if (part.first_replica) add_boxes(out, state_path(part.name, buffer), part.shape, part.begin, tensor.detach().reshape(-1));
  }
  if (!main_rank) return;
  for (const auto& [position, values] : state.values.at("params").items()) {
    if (!values.contains("step")) continue;
    // torch.optim keeps the step as a 0-dim float32 tensor (Note [Adam as Python computes it]).
    out.tensors.push_back({state_path(positions.at(position)->name, "step"), {}, {},
                           torch::tensor(static_cast<float>(values.at("step").get<int64_t>()))});
  }
  const json& groups = state.values.at("groups");
  for (size_t g = 0; g < groups.size(); ++g) {
    const json& options = groups[g].at("options");
    for (const auto& [key, flag_default] : keys) {
      out.objects.push_back({json::array({kOptim, "param_groups", g, key}),
                             python_value(options.contains(key) ? options.at(key) : flag_default)});
    }
    c10::List<std::string> names;
    for (size_t i = 0; i < groups[g].at("num_params").get<size_t>(); ++i) {
      names.push_back(positions.at(std::to_string(g) + "." + std::to_string(i))->name);
    }
    out.objects.push_back({json::array({kOptim, "param_groups", g, "params"}), c10::IValue(names)});
  }
}

// The optimizer's state as save_optimizer_state lays it out, from the
// checkpoint: this rank's elements of each buffer, the steps, the options.
// Returns the largest step.
int64_t load_optimizer(torch::optim::Optimizer& optimizer, const std::vector<Part>& parts, const DcpReader& reader) {
  State state = save_optimizer_state(optimizer);  // this optimizer's groups and options
  state.tensors.clear();
  state.values["params"] = json::object();
  const auto positions = parts_by_position(optimizer, parts);
  const std::vector<std::string> names = reader.tensor_names();
  int64_t steps = 0;
  for (const auto& [position, part] : positions) {
    const std::string prefix = dcp_name(state_path(part->name, ""));
    for (auto it = std::lower_bound(names.begin(), names.end(), prefix); it != names.end() && it->rfind(prefix, 0) == 0;
         ++it) {
      const std::string buffer = it->substr(prefix.size());
      if (buffer.find('.') != std::string::npos) continue;  // another parameter's, whose name extends this one's
      if (buffer == "step") {
        const double step = reader.read(*it).item<double>();
        state.values["params"][position]["step"] = static_cast<int64_t>(std::llround(step));
        steps = std::max(steps, static_cast<int64_t>(std::llround(step)));
      } else if (reader.size(*it).empty()) {
        state.tensors[position + "." + buffer] = reader.read(*it);
      } else {
        torch::Tensor local = torch::empty({part->values.numel()}, torch::TensorOptions().dtype(reader.dtype(*it)));
        read_boxes(reader, *it, part->shape, part->begin, local);
        // Shaped as the tensor the optimizer steps: a flat part under FSDP, the parameter itself where whole.
        state.tensors[position + "." + buffer] = local.view(part->leaf.sizes());
      }
    }
    if (state.tensors.lower_bound(position + ".") != state.tensors.end() &&
        state.tensors.lower_bound(position + ".")->first.rfind(position + ".", 0) == 0 &&
        !state.values["params"].contains(position)) {
      state.values["params"][position] = json::object();
    }
  }
  json& groups = state.values.at("groups");
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string group = str_cat(kOptim, ".param_groups.", g, ".");
    if (reader.has_object(group + "params")) {
      const Unpickled saved = reader.read_object(group + "params");
      const json saved_names = json_value(*saved.root, reader.dir() + ": " + group + "params");
      json mine = json::array();
      for (size_t i = 0; i < groups[g].at("num_params").get<size_t>(); ++i) {
        mine.push_back(positions.at(std::to_string(g) + "." + std::to_string(i))->name);
      }
      LOCKSTEP_CHECK(saved_names == mine, reader.dir(), ": the optimizer's group ", g, " holds the parameters ",
                     saved_names.dump(), " there and ", mine.dump(),
                     " here (another paramwise_cfg, or another model)");
    }
    for (auto& [key, value] : groups[g].at("options").items()) {
      if (!reader.has_object(group + key)) continue;
      const Unpickled saved = reader.read_object(group + key);
      value = json_value(*saved.root, reader.dir() + ": " + group + key);
    }
  }
  try {
    load_optimizer_state(optimizer, state);
  } catch (...) {
    rethrow_with_context(reader.dir() + ": loading the optimizer state");
  }
  return steps;
}

}  // namespace
}  // namespace dcp_state

DcpRankPart fsdp_dcp_part(const FullyShardedDataParallel& fsdp, const torch::optim::Optimizer* optimizer,
                          bool main_rank) {
  using dcp_state::kModel;
  DcpRankPart out;
  const std::vector<FullyShardedDataParallel::LocalPart> parts = fsdp.local_parts();
  for (const auto& part : parts) {
    if (!part.first_replica) continue;
    dcp_state::add_boxes(out, nlohmann::json::array({kModel, part.name}), part.shape, part.begin, part.values);
    for (const auto& alias : part.aliases) {
      dcp_state::add_boxes(out, nlohmann::json::array({kModel, alias}), part.shape, part.begin, part.values);
    }
  }
  if (main_rank) {
    for (const auto& [name, tensor] : fsdp.whole_tensors()) {
      out.tensors.push_back({nlohmann::json::array({kModel, name}), tensor.sizes().vec(),
                             std::vector<int64_t>(static_cast<size_t>(tensor.dim()), 0), tensor.detach()});
    }
  }
  if (optimizer != nullptr) dcp_state::add_optimizer(out, *optimizer, parts, main_rank);
  return out;
}

namespace dcp_state {
namespace {

// Every part's elements, the whole tensors and the optimizer's state from the checkpoint.
int64_t load_parts(const std::vector<Part>& parts, const std::vector<std::pair<std::string, torch::Tensor>>& whole,
                   const DcpReader& reader, torch::optim::Optimizer* optimizer) {
  torch::NoGradGuard no_grad;
  auto model_name = [&](const std::string& name) {
    const std::string entry = std::string(dcp_state::kModel) + "." + name;
    LOCKSTEP_CHECK(reader.has_tensor(entry), reader.dir(), ": the checkpoint holds no '", entry,
                   "' (its model entries are saved as model.<parameter name>, as dcp.save({\"model\": "
                   "get_model_state_dict(model), ...}) names them)");
    return entry;
  };
  for (const auto& part : parts) {
    dcp_state::read_boxes(reader, model_name(part.name), part.shape, part.begin, part.values);
  }
  for (const auto& [name, tensor] : whole) {
    const std::string entry = model_name(name);
    dcp_state::read_boxes(reader, entry, tensor.sizes().vec(), 0, tensor.detach().view({-1}));
  }
  return optimizer == nullptr ? 0 : dcp_state::load_optimizer(*optimizer, parts, reader);
}

}  // namespace
}  // namespace dcp_state

int64_t load_fsdp_dcp(FullyShardedDataParallel& fsdp, const DcpReader& reader, torch::optim::Optimizer* optimizer) {
  return dcp_state::load_parts(fsdp.local_parts(), fsdp.whole_tensors(), reader, optimizer);
}

// Note [A whole model from DCP]
// DCP describes each tensor whole and stores boxes of it, so any program may
// read it into any layout (PyTorch's dcp.load into a DDP model does this). A
// model every rank holds whole is the one-box case of an FSDP rank's parts:
// each parameter (once, under its first name; a tied one's further names
// are aliases) is a part that begins at element 0 and spans the parameter,
// stepped as itself; the buffers are whole tensors. A parameter whose
// elements are not laid out in order (channels_last) is read into a
// contiguous copy and copied back.
int64_t load_whole_model_dcp(torch::nn::Module& model, const DcpReader& reader, torch::optim::Optimizer* optimizer) {
  std::vector<dcp_state::Part> parts;
  std::unordered_map<const void*, size_t> part_of;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copied;  // a parameter, the contiguous copy read for it
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& param = item.value();
    auto [found, added] = part_of.emplace(param.unsafeGetTensorImpl(), parts.size());
    if (!added) {
      parts[found->second].aliases.push_back(item.key());
      continue;
    }
    dcp_state::Part part;
    part.name = item.key();
    part.shape = param.sizes().vec();
    torch::Tensor elements = param.detach();
    if (!elements.is_contiguous()) {
      elements = elements.contiguous();
      copied.emplace_back(param.detach(), elements);
    }
    part.values = elements.view({-1});
    if (param.requires_grad()) part.leaf = param;
    parts.push_back(std::move(part));
  }
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  for (const auto& item : model.named_buffers()) buffers.emplace_back(item.key(), item.value());
  const int64_t steps = dcp_state::load_parts(parts, buffers, reader, optimizer);
  torch::NoGradGuard no_grad;
  for (auto& [param, elements] : copied) param.copy_(elements);
  return steps;
}

}  // namespace lockstep
