#include "lockstep/optim/internal/optimizer_state_generic.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <tuple>
#include <utility>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include "lockstep/compat/internal/optim.h"
#include "lockstep/core/error.h"
#include "lockstep/core/shape_text.h"

namespace lockstep::detail {
namespace {

namespace optim = torch::optim;
using nlohmann::json;
const char* const kWhat = "optimizer state";

// ---- any other optimizer type ------------------------------------------------
//
// Note [Generic optimizer state]
// libtorch offers one way to see inside a parameter's optimizer state, the
// virtual OptimizerParamState::serialize(OutputArchive&), and one way to
// create such a state, the optimizer's own virtual load(InputArchive&) (a
// ParamState has no factory). So an optimizer type without a typed codec is
// saved by serialising each parameter's state and group's options and reading
// the archive back (an OutputArchive cannot be read: it goes through memory
// once), keeping tensors under "<g>.<i>.<key>" as the typed codecs do and
// everything else in values.params["<g>.<i>"][key] / values.groups[g].options.
// It is loaded by writing an archive in libtorch's optimizer format
// (torch/optim/serialize.h; the parameter names are compat's) and calling
// optimizer.load(), which libtorch's optimizers implement and any optimizer
// can with _TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG. The base class's load()
// does nothing, so afterwards every saved parameter must have state.
//
// What the codec holds: tensors of the parameter's shape (per-element
// buffers, the only ones FSDP can shard) and 0-dim tensors (a step kept as a
// tensor); int, float, bool, str and None values, and tuples and lists of
// those ({"__tuple__": [...]}, {"__list__": [...], "__element__": "float"},
// non-finite floats as {"__float__": "inf"}). Anything else (a list of
// tensors, as LBFGS keeps its history; a tensor of another shape; a nested
// archive) is refused when saving, naming the key and the type, rather than
// found out at resume. Missing buffers are the type's load() to notice:
// unlike the typed codecs, this one does not know which are required.
//
// Unlike the typed codecs, saving copies the tensors (out of the archive) and
// loading keeps each tensor's saved dtype, on its parameter's device. Tensors
// are written back as IValues, as libtorch's _TORCH_OPTIM_SERIALIZE_TORCH_ARG
// writes them; a state that writes archive.write(key, tensor, is_buffer) must
// read them back with try_read(key, IValue&).

const char* const kGenericSupported =
    "lockstep stores tensors of the parameter's shape, 0-dim tensors, and int, float, bool, str and None "
    "values and tuples and lists of those";

// Every entry of an archive read back from memory, in its key order.
using ArchiveEntries = std::vector<std::pair<std::string, c10::IValue>>;

// Runs `f`, turning any exception but a lockstep::Error into one that starts
// with `context`.
template <typename F>
auto with_context(const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (...) {
    rethrow_with_context(context);
  }
}

torch::serialize::InputArchive read_back(torch::serialize::OutputArchive& archive) {
  std::string bytes;
  archive.save_to([&](const void* data, size_t size) -> size_t {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::serialize::InputArchive input;
  input.load_from(bytes.data(), bytes.size());
  return input;
}

// Serialises `serializable` (a group's options or a parameter's state) and
// returns what the archive holds.
template <typename S>
ArchiveEntries serialized_entries(const S& serializable, const std::string& context) {
  return with_context(context, [&] {
    torch::serialize::OutputArchive archive;
    serializable.serialize(archive);
    torch::serialize::InputArchive input = read_back(archive);
    ArchiveEntries entries;
    for (const std::string& key : input.keys()) {
      c10::IValue value;
      input.read(key, value);
      entries.emplace_back(key, std::move(value));
    }
    return entries;
  });
}

std::string ivalue_kind(const c10::IValue& value) {
  if (value.isObject()) return "a nested archive";
  return str_cat("of type ", value.type()->str());
}

std::optional<json> scalar_to_json(const c10::IValue& value) {
  if (value.isNone()) return json(nullptr);
  if (value.isBool()) return json(value.toBool());
  if (value.isInt()) return json(value.toInt());
  if (value.isString()) return json(value.toStringRef());
  if (value.isDouble()) {
    const double number = value.toDouble();
    if (std::isfinite(number)) return json(number);
    return json{{"__float__", std::isnan(number) ? "nan" : number > 0 ? "inf" : "-inf"}};
  }
  return std::nullopt;
}

// The JSON form of a non-tensor archive value; nullopt when the codec cannot
// hold it (Note [Generic optimizer state]).
std::optional<json> value_to_json(const c10::IValue& value) {
  if (auto scalar = scalar_to_json(value)) return scalar;
  auto sequence = [](c10::ArrayRef<c10::IValue> items) -> std::optional<json> {
    json out = json::array();
    for (const auto& item : items) {
      auto scalar = scalar_to_json(item);
      if (!scalar) return std::nullopt;
      out.push_back(*scalar);
    }
    return out;
  };
  if (value.isTuple()) {
    auto items = sequence(value.toTupleRef().elements().asArrayRef());
    if (!items) return std::nullopt;
    return json{{"__tuple__", *items}};
  }
  if (value.isList()) {
    const std::string element = value.toList().elementType()->str();
    if (element != "int" && element != "float" && element != "bool" && element != "str") return std::nullopt;
    auto items = sequence(value.toListRef());
    if (!items) return std::nullopt;
    return json{{"__list__", *items}, {"__element__", element}};
  }
  return std::nullopt;
}

c10::IValue scalar_from_json(const json& value, const std::string& what) {
  switch (value.type()) {
    case json::value_t::null:
      return c10::IValue();
    case json::value_t::boolean:
      return c10::IValue(value.get<bool>());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return c10::IValue(value.get<int64_t>());
    case json::value_t::number_float:
      return c10::IValue(value.get<double>());
    case json::value_t::string:
      return c10::IValue(value.get<std::string>());
    default:
      break;
  }
  if (value.is_object() && value.size() == 1 && value.contains("__float__")) {
    const std::string text = value.at("__float__").get<std::string>();
    if (text == "nan") return c10::IValue(std::numeric_limits<double>::quiet_NaN());
    if (text == "inf") return c10::IValue(std::numeric_limits<double>::infinity());
    if (text == "-inf") return c10::IValue(-std::numeric_limits<double>::infinity());
  }
  LOCKSTEP_FAIL(kWhat, ": ", what, " is not a value lockstep wrote: ", value.dump());
}

template <typename T>
c10::IValue list_from_json(const json& items, const std::string& what) {
  c10::List<T> list;
  for (const auto& item : items) {
    c10::IValue element = scalar_from_json(item, what);
    if constexpr (std::is_same_v<T, int64_t>) {
      LOCKSTEP_CHECK(element.isInt(), kWhat, ": ", what, " holds a non-int in an int list: ", items.dump());
      list.push_back(element.toInt());
    } else if constexpr (std::is_same_v<T, double>) {
      LOCKSTEP_CHECK(element.isDouble(), kWhat, ": ", what, " holds a non-float in a float list: ", items.dump());
      list.push_back(element.toDouble());
    } else if constexpr (std::is_same_v<T, bool>) {
      LOCKSTEP_CHECK(element.isBool(), kWhat, ": ", what, " holds a non-bool in a bool list: ", items.dump());
      list.push_back(element.toBool());
    } else {
      LOCKSTEP_CHECK(element.isString(), kWhat, ": ", what, " holds a non-str in a str list: ", items.dump());
      list.push_back(element.toStringRef());
    }
  }
  return c10::IValue(std::move(list));
}

// The archive value of value_to_json's output; `what` names it in errors.
c10::IValue value_from_json(const json& value, const std::string& what) {
  if (value.is_object() && value.contains("__tuple__")) {
    const json& items = value.at("__tuple__");
    LOCKSTEP_CHECK(items.is_array(), kWhat, ": ", what, " is a malformed tuple: ", value.dump());
    std::vector<c10::IValue> elements;
    for (const auto& item : items) elements.push_back(scalar_from_json(item, what));
    return c10::IValue(c10::ivalue::Tuple::create(std::move(elements)));
  }
  if (value.is_object() && value.contains("__list__")) {
    const json& items = value.at("__list__");
    const std::string element = value.value("__element__", "");
    LOCKSTEP_CHECK(items.is_array(), kWhat, ": ", what, " is a malformed list: ", value.dump());
    if (element == "int") return list_from_json<int64_t>(items, what);
    if (element == "float") return list_from_json<double>(items, what);
    if (element == "bool") return list_from_json<bool>(items, what);
    if (element == "str") return list_from_json<std::string>(items, what);
    LOCKSTEP_FAIL(kWhat, ": ", what, " is a list of an unknown element type: ", value.dump());
  }
  return scalar_from_json(value, what);
}

State save_any(const optim::Optimizer& optimizer) {
  const std::string type = optimizer_type_name(optimizer);
  const auto options_of = [&](size_t g) {
    json options = json::object();
    const std::string context = str_cat(kWhat, " of ", type, ": serialising the options of group ", g);
    for (auto& [key, value] : serialized_entries(optimizer.param_groups()[g].options(), context)) {
      std::optional<json> encoded = value_to_json(value);
      LOCKSTEP_CHECK(encoded.has_value(), kWhat, " of ", type, ": option '", key, "' of group ", g, " is ",
                     ivalue_kind(value), ", which cannot be saved (", kGenericSupported, ")");
      options[key] = std::move(*encoded);
    }
    return options;
  };
  const auto state_of = [&](size_t g, size_t i, const torch::Tensor& param, const optim::OptimizerParamState& saved,
                            std::map<std::string, torch::Tensor>& buffers) {
    const std::string where = describe(g, i, nullptr);
    json entry = json::object();
    const std::string state_context = str_cat(kWhat, " of ", type, ": serialising the state of ", where);
    for (auto& [key, value] : serialized_entries(saved, state_context)) {
      if (value.isTensor()) {
        torch::Tensor tensor = value.toTensor().detach();
        LOCKSTEP_CHECK(tensor.dim() == 0 || tensor.sizes() == param.sizes(), kWhat, " of ", type, ": ", where,
                       ": '", key, "' has shape ", shape_text(tensor.sizes()), " but the parameter ",
                       shape_text(param.sizes()), ", which cannot be saved (", kGenericSupported, ")");
        buffers[key] = tensor;
        continue;
      }
      std::optional<json> encoded = value_to_json(value);
      LOCKSTEP_CHECK(encoded.has_value(), kWhat, " of ", type, ": ", where, ": '", key, "' is ", ivalue_kind(value),
                     ", which cannot be saved (", kGenericSupported, ")");
      entry[key] = std::move(*encoded);
    }
    return entry;
  };
  return save_state(optimizer, type, options_of, state_of);
}

int64_t ivalue_bytes(const c10::IValue& value) {
  if (value.isTensor()) {
    const torch::Tensor& tensor = value.toTensor();
    return tensor.defined() ? tensor.numel() * static_cast<int64_t>(tensor.element_size()) : 0;
  }
  int64_t bytes = 0;
  if (value.isList()) {
    for (const auto& item : value.toListRef()) bytes += ivalue_bytes(item);
  } else if (value.isTuple()) {
    for (const auto& item : value.toTupleRef().elements().asArrayRef()) bytes += ivalue_bytes(item);
  }
  return bytes;
}

int64_t bytes_of_any(const optim::Optimizer& optimizer) {
  const std::string type = optimizer_type_name(optimizer);
  int64_t bytes = 0;
  const auto& param_state = optimizer.state();
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      auto found = param_state.find(compat::param_state_key(param_state, groups[g].params()[i]));
      if (found == param_state.end()) continue;
      // One parameter at a time: the copies never exceed one parameter's state.
      const std::string context = str_cat(kWhat, " of ", type, ": counting the bytes of ", describe(g, i, nullptr));
      for (const auto& entry : serialized_entries(*found->second, context)) {
        bytes += ivalue_bytes(entry.second);
      }
    }
  }
  return bytes;
}

// "0.3.exp_avg" -> {"0.3", "exp_avg"}; false for a name without two dots.
bool split_tensor_name(const std::string& name, std::string* position_text, std::string* key) {
  const size_t first = name.find('.');
  const size_t second = first == std::string::npos ? first : name.find('.', first + 1);
  if (second == std::string::npos || second + 1 == name.size()) return false;
  *position_text = name.substr(0, second);
  *key = name.substr(second + 1);
  return true;
}

// Writes `entries` into a new archive under `parent`'s compilation unit.
torch::serialize::OutputArchive archive_of(const torch::serialize::OutputArchive& parent,
                                           const ArchiveEntries& entries) {
  torch::serialize::OutputArchive archive(parent.compilation_unit());
  for (const auto& [key, value] : entries) archive.write(key, value);
  return archive;
}

using ParamGroups = std::vector<optim::OptimizerParamGroup>;
using ParamStates = std::map<std::pair<size_t, size_t>, ArchiveEntries>;  // (group, index) -> its state's entries

// Pass 1, the groups: each group's options decoded, its parameter count checked.
std::vector<ArchiveEntries> decode_group_options(const json& groups, const ParamGroups& param_groups) {
  std::vector<ArchiveEntries> options(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const size_t saved_count = groups[g].at("num_params").get<size_t>();
    LOCKSTEP_CHECK(saved_count == param_groups[g].params().size(), kWhat, ": group ", g, " has ", saved_count,
                   " parameter(s) in the checkpoint but ", param_groups[g].params().size(), " in the optimizer");
    const json& saved = groups[g].at("options");
    LOCKSTEP_CHECK(saved.is_object(), kWhat, ": group ", g, " options are not a map: ", saved.dump());
    for (const auto& item : saved.items()) {
      options[g].emplace_back(item.key(), value_from_json(item.value(), str_cat("group ", g, " option '",
                                                                                 item.key(), "'")));
    }
  }
  return options;
}

// Pass 1, the parameters' values: every parameter with saved state, its values decoded.
ParamStates decode_param_values(const json& params, const ParamGroups& param_groups,
                                const std::vector<ParamGroupInfo>* names) {
  ParamStates states;
  for (const auto& entry : params.items()) {
    size_t g = 0, i = 0;
    std::tie(g, i) = checked_position(entry.key(), param_groups);
    LOCKSTEP_CHECK(entry.value().is_object(), kWhat, ": ", describe(g, i, names), ": its entry is not a map: ",
                   entry.value().dump());
    ArchiveEntries& entries = states[{g, i}];
    for (const auto& item : entry.value().items()) {
      entries.emplace_back(item.key(), value_from_json(item.value(), str_cat(describe(g, i, names), ": '",
                                                                               item.key(), "'")));
    }
  }
  return states;
}

// Pass 1, the parameters' buffers: each tensor checked against its parameter
// and copied onto the parameter's device, in its saved dtype.
void add_param_buffers(const State& state, const std::string& type, const ParamGroups& param_groups,
                       const std::vector<ParamGroupInfo>* names, ParamStates& states) {
  for (const auto& [name, tensor] : state.tensors) {
    std::string position_text, key;
    size_t g = 0, i = 0;
    LOCKSTEP_CHECK(split_tensor_name(name, &position_text, &key) && parse_position(position_text, &g, &i) &&
                       states.count({g, i}),
                   kWhat, ": the checkpoint has a tensor '", name, "' that is no buffer of a parameter with ",
                   type, " state");
    const torch::Tensor& param = param_groups[g].params()[i];
    LOCKSTEP_CHECK(tensor.defined() && (tensor.dim() == 0 || tensor.sizes() == param.sizes()), kWhat, ": ",
                   describe(g, i, names), ": '", key, "' has shape ",
                   tensor.defined() ? shape_text(tensor.sizes()) : "(undefined)",
                   " in the checkpoint but the parameter has shape ", shape_text(param.sizes()),
                   " (a buffer has the parameter's shape or none)");
    ArchiveEntries& entries = states[{g, i}];
    for (const auto& existing : entries) {
      LOCKSTEP_CHECK(existing.first != key, kWhat, ": ", describe(g, i, names), ": '", key,
                     "' is both a tensor and a value in the checkpoint");
    }
    torch::NoGradGuard no_grad;
    entries.emplace_back(key, tensor.detach().to(param.device(), tensor.scalar_type(), /*non_blocking=*/false,
                                                 /*copy=*/true));
  }
}

// The archive optimizer.load() reads (torch/optim/serialize.h).
torch::serialize::InputArchive optimizer_archive(const std::string& type, const ParamGroups& param_groups,
                                                 const ParamStates& states,
                                                 const std::vector<ArchiveEntries>& options) {
  return with_context(str_cat(kWhat, ": writing ", type, " state"), [&] {
    torch::serialize::OutputArchive root;
    root.write("pytorch_version", c10::IValue("1.5.0"));
    torch::serialize::OutputArchive state_archive(root.compilation_unit());
    torch::serialize::OutputArchive groups_archive(root.compilation_unit());
    groups_archive.write("param_groups/size", torch::tensor(static_cast<int64_t>(param_groups.size())));
    size_t ordinal = 0;
    for (size_t g = 0; g < param_groups.size(); ++g) {
      torch::serialize::OutputArchive group_archive(root.compilation_unit());
      const size_t count = param_groups[g].params().size();
      group_archive.write("params/size", torch::tensor(static_cast<int64_t>(count)));
      for (size_t i = 0; i < count; ++i) {
        const std::string key = compat::optimizer_archive_key(ordinal++);
        group_archive.write("params/" + std::to_string(i), c10::IValue(key));
        auto found = states.find({g, i});
        if (found == states.end()) continue;
        torch::serialize::OutputArchive param_archive = archive_of(root, found->second);
        state_archive.write(key, param_archive);
      }
      torch::serialize::OutputArchive options_archive = archive_of(root, options[g]);
      group_archive.write("options", options_archive);
      groups_archive.write("param_groups/" + std::to_string(g), group_archive);
    }
    root.write("state", state_archive);
    root.write("param_groups", groups_archive);
    return read_back(root);
  });
}

// Each group's options, checked on a copy: an option the type does not
// read back is a libtorch assertion, which must come before any change.
std::vector<torch::serialize::InputArchive> checked_options_archives(const std::string& type,
                                                                     const ParamGroups& param_groups,
                                                                     const std::vector<ArchiveEntries>& options) {
  std::vector<torch::serialize::InputArchive> options_archives;
  for (size_t g = 0; g < param_groups.size(); ++g) {
    with_context(str_cat(kWhat, ": restoring the options of group ", g, " of ", type), [&] {
      torch::serialize::OutputArchive archive;
      for (const auto& [key, value] : options[g]) archive.write(key, value);
      options_archives.push_back(read_back(archive));
      param_groups[g].options().clone()->serialize(options_archives.back());
    });
  }
  return options_archives;
}

[[noreturn]] void fail_not_restored(const std::string& type, size_t g, size_t i,
                                    const std::vector<ParamGroupInfo>* names) {
  LOCKSTEP_FAIL(kWhat, ": ", type, " did not restore the state of ", describe(g, i, names),
                " from the checkpoint: the type does not implement load() (libtorch's Optimizer::load() does "
                "nothing), so its state can be neither resumed nor moved. Give it save() and load() as "
                "libtorch's own optimizers have them (torch/optim/sgd.h): `void save(torch::serialize::"
                "OutputArchive& archive) const override { serialize(*this, archive); }`, the same for "
                "load(torch::serialize::InputArchive&), and `template <typename Self, typename Archive> static "
                "void serialize(Self& self, Archive& archive) { _TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG(Name); }` "
                "with NameParamState and NameOptions implementing serialize(), NameOptions constructible from "
                "a learning rate");
}

// Pass 2, the parameters' states: optimizer.load() on the archive. The
// states of the optimizer's parameters are set aside, so that a load() that
// fails, or restores no state, leaves them as they were.
void load_param_states(optim::Optimizer& optimizer, const std::string& type,
                       torch::serialize::InputArchive& load_archive, const ParamStates& states,
                       const std::vector<ParamGroupInfo>* names) {
  auto& param_groups = optimizer.param_groups();
  auto& param_state = optimizer.state();
  using Key = std::remove_cv_t<std::remove_reference_t<decltype(param_state)>>::key_type;
  std::vector<Key> keys;
  std::vector<std::pair<Key, std::unique_ptr<optim::OptimizerParamState>>> set_aside;
  for (const auto& group : param_groups) {
    for (const auto& param : group.params()) {
      keys.push_back(compat::param_state_key(param_state, param));
      auto found = param_state.find(keys.back());
      if (found == param_state.end()) continue;
      set_aside.emplace_back(keys.back(), std::move(found->second));
      param_state.erase(found);
    }
  }
  auto put_back = [&] {
    for (const auto& key : keys) param_state.erase(key);
    for (auto& [key, previous] : set_aside) param_state[key] = std::move(previous);
  };
  try {
    optimizer.load(load_archive);
  } catch (...) {
    put_back();
    rethrow_with_context(str_cat(kWhat, ": ", type, "::load() failed on the checkpoint's state"));
  }
  for (const auto& [place, entries] : states) {
    const auto& param = param_groups[place.first].params()[place.second];
    if (param_state.count(compat::param_state_key(param_state, param))) continue;
    put_back();
    fail_not_restored(type, place.first, place.second, names);
  }
}

void load_any(optim::Optimizer& optimizer, const State& state, const std::vector<ParamGroupInfo>* names) {
  const std::string type = optimizer_type_name(optimizer);
  const json& values = state.values;
  const std::string saved_type = value_at(values, "type", json::value_t::string).get<std::string>();
  LOCKSTEP_CHECK(saved_type == type, kWhat, ": the checkpoint holds ", saved_type, " state but the optimizer is ",
                 type);
  const json& groups = value_at(values, "groups", json::value_t::array);
  const json& params = value_at(values, "params", json::value_t::object);
  auto& param_groups = optimizer.param_groups();
  check_group_count(kWhat, groups.size(), param_groups.size());

  // Pass 1: check and decode everything, changing nothing.
  const std::vector<ArchiveEntries> options = decode_group_options(groups, param_groups);
  ParamStates states = decode_param_values(params, param_groups, names);
  add_param_buffers(state, type, param_groups, names, states);
  torch::serialize::InputArchive load_archive = optimizer_archive(type, param_groups, states, options);
  std::vector<torch::serialize::InputArchive> options_archives = checked_options_archives(type, param_groups, options);

  // Pass 2: apply.
  load_param_states(optimizer, type, load_archive, states, names);
  for (size_t g = 0; g < param_groups.size(); ++g) {
    with_context(str_cat(kWhat, ": restoring the options of group ", g, " of ", type),
                 [&] { param_groups[g].options().serialize(options_archives[g]); });
  }
}
}  // namespace

State save_generic(const torch::optim::Optimizer& optimizer) { return save_any(optimizer); }

void load_generic(torch::optim::Optimizer& optimizer, const State& state, const std::vector<ParamGroupInfo>* names) {
  load_any(optimizer, state, names);
}

int64_t generic_bytes(const torch::optim::Optimizer& optimizer) { return bytes_of_any(optimizer); }

}  // namespace lockstep::detail
