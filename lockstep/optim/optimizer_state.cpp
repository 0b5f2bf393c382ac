#include "lockstep/optim/optimizer_state.h"

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
#include "lockstep/optim/device_side_step.h"
#include "lockstep/optim/internal/optimizer_state_generic.h"

namespace lockstep {
namespace {

namespace optim = torch::optim;
using nlohmann::json;
using detail::checked_position;
using detail::describe;
using detail::parse_position;
using detail::position;
using detail::value_at;
const char* const kWhat = "optimizer state";

// One optimizer type's option and buffer layout. The field lists below are the
// single description used for both saving and loading.
template <typename OptimizerT, typename OptionsT, typename ParamStateT>
struct Codec {
  using Optimizer = OptimizerT;
  using Options = OptionsT;
  using ParamState = ParamStateT;
};
using SgdCodec = Codec<optim::SGD, optim::SGDOptions, optim::SGDParamState>;
using AdamCodec = Codec<optim::Adam, optim::AdamOptions, optim::AdamParamState>;
using AdamWCodec = Codec<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState>;
using RmspropCodec = Codec<optim::RMSprop, optim::RMSpropOptions, optim::RMSpropParamState>;

template <typename T, typename... Us>
constexpr bool is_one_of = (std::is_same_v<std::remove_const_t<T>, Us> || ...);

// Calls f(key, field) for every option of `options`.
template <typename O, typename F>
void for_each_option(O& options, F&& f) {
  f("lr", options.lr());
  if constexpr (is_one_of<O, optim::SGDOptions>) {
    f("momentum", options.momentum());
    f("dampening", options.dampening());
    f("weight_decay", options.weight_decay());
    f("nesterov", options.nesterov());
  } else if constexpr (is_one_of<O, optim::AdamOptions, optim::AdamWOptions>) {
    f("betas", options.betas());
    f("eps", options.eps());
    f("weight_decay", options.weight_decay());
    f("amsgrad", options.amsgrad());
  } else if constexpr (is_one_of<O, optim::RMSpropOptions>) {
    f("alpha", options.alpha());
    f("eps", options.eps());
    f("weight_decay", options.weight_decay());
    f("momentum", options.momentum());
    f("centered", options.centered());
  }
}

// Calls f(key, buffer, required) for every tensor buffer of a parameter's
// state; `required` says whether a step with these options needs it.
template <typename S, typename O, typename F>
void for_each_buffer(S& state, const O& options, F&& f) {
  if constexpr (is_one_of<S, optim::SGDParamState>) {
    f("momentum_buffer", state.momentum_buffer(), true);
  } else if constexpr (is_one_of<S, optim::AdamParamState, optim::AdamWParamState>) {
    f("exp_avg", state.exp_avg(), true);
    f("exp_avg_sq", state.exp_avg_sq(), true);
    f("max_exp_avg_sq", state.max_exp_avg_sq(), options.amsgrad());
  } else if constexpr (is_one_of<S, optim::RMSpropParamState>) {
    f("square_avg", state.square_avg(), true);
    f("momentum_buffer", state.momentum_buffer(), options.momentum() > 0);
    f("grad_avg", state.grad_avg(), options.centered());
  }
}

template <typename S, typename = void>
struct HasStep : std::false_type {};
template <typename S>
struct HasStep<S, std::void_t<decltype(std::declval<S&>().step())>> : std::true_type {};

// Note [Why the optimizer code asks for types]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Elsewhere lockstep asks an object what it can do instead of which type it
// is. Optimizers are the exception, for a reason libtorch sets: its
// Optimizer and OptimizerOptions expose, virtually, only lr (get_lr/set_lr),
// serialize() into a write-only archive and the optimizer's load(). So:
//   - any optimizer checkpoints through those (Note [Generic optimizer
//     state]): reading its state generically is what every type gets;
//   - SGD, Adam, AdamW and RMSprop also have typed codecs, chosen here by
//     dynamic_cast (which matches subclasses, such as lockstep::Adam), because
//     serialize() copies every buffer and spells options its own way: the
//     typed codecs alias the live buffers, as PyTorch's state_dict does (no
//     copy of Adam's two buffers per parameter at each save), check which
//     buffers a step with these options needs, and keep the layout every
//     checkpoint of these types already holds ("betas": [b1, b2]);
//   - schedulers reach momentum and weight_decay (param_groups.cpp) through
//     the options' concrete type, since no virtual gives them; an options type
//     lockstep does not know offers lr only, and the error says so.
// A capability on Optimizer would need a change to libtorch.

// Calls f(codec, type name) for the four types with a typed codec and returns
// true; false (f not called) for any other type, which the generic codec
// below serves (Note [Why the optimizer code asks for types]).
template <typename F>
bool with_codec(const optim::Optimizer& optimizer, F&& f) {
  if (dynamic_cast<const optim::SGD*>(&optimizer)) {
    f(SgdCodec{}, "SGD");
  } else if (dynamic_cast<const optim::Adam*>(&optimizer)) {
    f(AdamCodec{}, "Adam");
  } else if (dynamic_cast<const optim::AdamW*>(&optimizer)) {
    f(AdamWCodec{}, "AdamW");
  } else if (dynamic_cast<const optim::RMSprop*>(&optimizer)) {
    f(RmspropCodec{}, "RMSprop");
  } else {
    return false;
  }
  return true;
}

// A group's options as the codec's options type.
template <typename C>
const typename C::Options& options_in(const optim::OptimizerParamGroup& group) {
  return static_cast<const typename C::Options&>(group.options());
}

template <typename C>
State save_typed(const optim::Optimizer& optimizer, const char* type) {
  const auto options_of = [&](size_t g) {
    json options = json::object();
    for_each_option(options_in<C>(optimizer.param_groups()[g]),
                    [&](const char* key, const auto& value) { options[key] = value; });
    return options;
  };
  const auto state_of = [&](size_t g, size_t, const torch::Tensor&, const optim::OptimizerParamState& saved,
                            std::map<std::string, torch::Tensor>& buffers) {
    const auto& typed = static_cast<const typename C::ParamState&>(saved);
    json entry = json::object();
    if constexpr (HasStep<typename C::ParamState>::value) entry["step"] = typed.step();
    for_each_buffer(typed, options_in<C>(optimizer.param_groups()[g]),
                    [&](const char* key, const torch::Tensor& buffer, bool) {
                      if (buffer.defined()) buffers[key] = buffer;
                    });
    return entry;
  };
  return detail::save_state(optimizer, type, options_of, state_of);
}

// Pass 1, the groups: each group's options as the codec's type, its
// parameter count checked.
template <typename C>
std::vector<typename C::Options> decode_typed_options(const json& groups,
                                                      const std::vector<optim::OptimizerParamGroup>& param_groups) {
  using Options = typename C::Options;
  std::vector<Options> new_options;
  for (size_t g = 0; g < groups.size(); ++g) {
    const size_t saved_count = groups[g].at("num_params").get<size_t>();
    LOCKSTEP_CHECK(saved_count == param_groups[g].params().size(), kWhat, ": group ", g,
                   " has ", saved_count, " parameter(s) in the checkpoint but ",
                   param_groups[g].params().size(), " in the optimizer");
    Options options = options_in<C>(param_groups[g]);
    const json& saved = groups[g].at("options");
    for_each_option(options, [&](const char* key, auto& field) {
      LOCKSTEP_CHECK(saved.contains(key), kWhat, ": group ", g, " has no option '", key, "'");
      try {
        field = saved.at(key).get<std::remove_reference_t<decltype(field)>>();
      } catch (const json::exception&) {
        LOCKSTEP_FAIL(kWhat, ": group ", g, " option '", key, "' has the wrong type: ",
                      saved.at(key).dump());
      }
    });
    new_options.push_back(options);
  }
  return new_options;
}

// Pass 1, the parameters: each saved parameter's step and the buffers its
// group's options need, of the parameter's shape; no tensor the type does
// not use.
template <typename C>
void check_typed_params(const State& state, const json& params, const char* type,
                        const std::vector<optim::OptimizerParamGroup>& param_groups,
                        const std::vector<typename C::Options>& new_options,
                        const std::vector<ParamGroupInfo>* names) {
  using ParamState = typename C::ParamState;
  std::set<std::string> expected_tensors;
  for (const auto& entry : params.items()) {
    size_t g = 0, i = 0;
    std::tie(g, i) = checked_position(entry.key(), param_groups);
    const torch::Tensor& param = param_groups[g].params()[i];
    if constexpr (HasStep<ParamState>::value) {
      LOCKSTEP_CHECK(entry.value().contains("step") && entry.value().at("step").is_number_integer(),
                     kWhat, ": ", describe(g, i, names), ": the checkpoint has no integer 'step'");
    }
    ParamState probe;
    for_each_buffer(probe, new_options[g], [&](const char* key, const torch::Tensor&, bool required) {
      const std::string name = entry.key() + "." + key;
      auto found = state.tensors.find(name);
      if (found == state.tensors.end()) {
        LOCKSTEP_CHECK(!required, kWhat, ": ", describe(g, i, names), ": the checkpoint has no '",
                       key, "' buffer (tensor '", name, "')");
        return;
      }
      expected_tensors.insert(name);
      LOCKSTEP_CHECK(found->second.defined() && found->second.sizes() == param.sizes(), kWhat,
                     ": ", describe(g, i, names), ": '", key, "' has shape ",
                     found->second.defined() ? shape_text(found->second.sizes()) : "(undefined)",
                     " in the checkpoint but the parameter has shape ", shape_text(param.sizes()));
    });
  }
  for (const auto& entry : state.tensors) {
    LOCKSTEP_CHECK(expected_tensors.count(entry.first), kWhat, ": the checkpoint has a tensor '",
                   entry.first, "' that ", type, " state does not use");
  }
}

// Pass 2: every group's options and every parameter's state replaced by the
// checkpoint's (a parameter without saved state is left without).
template <typename C>
void apply_typed(optim::Optimizer& optimizer, const State& state, const json& params,
                 const std::vector<typename C::Options>& new_options) {
  using Options = typename C::Options;
  using ParamState = typename C::ParamState;
  auto& param_groups = optimizer.param_groups();
  auto& param_state = optimizer.state();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    static_cast<Options&>(param_groups[g].options()) = new_options[g];
    for (size_t i = 0; i < param_groups[g].params().size(); ++i) {
      const torch::Tensor& param = param_groups[g].params()[i];
      const auto key = compat::param_state_key(param_state, param);
      param_state.erase(key);
      auto entry = params.find(position(g, i));
      if (entry == params.end()) continue;
      auto restored = std::make_unique<ParamState>();
      if constexpr (HasStep<ParamState>::value) restored->step(entry->at("step").get<int64_t>());
      for_each_buffer(*restored, new_options[g], [&](const char* name, torch::Tensor& buffer, bool) {
        auto found = state.tensors.find(position(g, i) + "." + name);
        if (found == state.tensors.end()) return;
        torch::NoGradGuard no_grad;
        buffer = found->second.to(param.options(), /*non_blocking=*/false, /*copy=*/true).detach();
      });
      param_state[key] = std::move(restored);
    }
  }
}

template <typename C>
void load_typed(optim::Optimizer& optimizer, const State& state, const char* type,
                const std::vector<ParamGroupInfo>* names) {
  const json& values = state.values;
  const std::string saved_type = value_at(values, "type", json::value_t::string).get<std::string>();
  LOCKSTEP_CHECK(saved_type == type, kWhat, ": the checkpoint holds ", saved_type,
                 " state but the optimizer is ", type);
  const json& groups = value_at(values, "groups", json::value_t::array);
  const json& params = value_at(values, "params", json::value_t::object);
  auto& param_groups = optimizer.param_groups();
  detail::check_group_count(kWhat, groups.size(), param_groups.size());

  // Pass 1: check everything and decode the options, changing nothing.
  const std::vector<typename C::Options> new_options = decode_typed_options<C>(groups, param_groups);
  check_typed_params<C>(state, params, type, param_groups, new_options, names);
  // Pass 2: apply.
  apply_typed<C>(optimizer, state, params, new_options);
}

template <typename C>
int64_t typed_bytes(const optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  const auto& param_state = optimizer.state();
  for (const auto& group : optimizer.param_groups()) {
    const auto& options = options_in<C>(group);
    for (const auto& param : group.params()) {
      auto found = param_state.find(compat::param_state_key(param_state, param));
      if (found == param_state.end()) continue;
      const auto& typed = static_cast<const typename C::ParamState&>(*found->second);
      for_each_buffer(typed, options, [&](const char*, const torch::Tensor& buffer, bool) {
        if (buffer.defined()) bytes += buffer.numel() * static_cast<int64_t>(buffer.element_size());
      });
    }
  }
  return bytes;
}

}  // namespace

namespace detail {

std::string position(size_t group, size_t index) {
  return std::to_string(group) + "." + std::to_string(index);
}

void check_group_count(const char* what, size_t saved, size_t now) {
  LOCKSTEP_CHECK(saved == now, what, ": the checkpoint has ", saved, " parameter group(s) but the optimizer has ", now,
                 " (with paramwise_cfg every parameter has a group of its own since 2026-12-05, as in mmengine; a "
                 "checkpoint from before merged equal groups: load its weights with load_from, or resume it with the "
                 "lockstep that wrote it)");
}

// "group 1, parameter 3 (backbone.conv.weight)"
std::string describe(size_t group, size_t index, const std::vector<ParamGroupInfo>* groups) {
  std::string text = str_cat("group ", group, ", parameter ", index);
  if (groups && group < groups->size() && index < (*groups)[group].param_names.size()) {
    text += " (" + (*groups)[group].param_names[index] + ")";
  }
  return text;
}

const nlohmann::json& value_at(const nlohmann::json& values, const char* key, nlohmann::json::value_t kind) {
  LOCKSTEP_CHECK(values.is_object() && values.contains(key), "optimizer state: the checkpoint has no '",
                 key, "' entry; is this an optimizer state?");
  const nlohmann::json& value = values.at(key);
  LOCKSTEP_CHECK(value.type() == kind, "optimizer state", ": '", key, "' has the wrong type: ", value.dump());
  return value;
}

// Parses "g.i" into its two numbers; false when malformed.
bool parse_position(const std::string& text, size_t* group, size_t* index) {
  size_t dot = text.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == text.size()) return false;
  for (size_t k = 0; k < text.size(); ++k) {
    if (k != dot && !std::isdigit(static_cast<unsigned char>(text[k]))) return false;
  }
  *group = std::stoul(text.substr(0, dot));
  *index = std::stoul(text.substr(dot + 1));
  return true;
}

std::pair<size_t, size_t> checked_position(const std::string& text,
                                           const std::vector<optim::OptimizerParamGroup>& param_groups) {
  size_t g = 0, i = 0;
  LOCKSTEP_CHECK(parse_position(text, &g, &i) && g < param_groups.size() && i < param_groups[g].params().size(),
                 kWhat, ": the checkpoint has state for parameter '", text,
                 "', which is not a <group>.<index> of this optimizer");
  return {g, i};
}

State save_state(const optim::Optimizer& optimizer, const std::string& type, const GroupOptionsJson& options_of,
                 const ParamStateJson& state_of) {
  State state;
  state.values["type"] = type;
  json groups = json::array();
  json params = json::object();
  const auto& param_state = optimizer.state();
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& group = optimizer.param_groups()[g];
    groups.push_back({{"num_params", group.params().size()}, {"options", options_of(g)}});
    for (size_t i = 0; i < group.params().size(); ++i) {
      const torch::Tensor& param = group.params()[i];
      auto found = param_state.find(compat::param_state_key(param_state, param));
      if (found == param_state.end()) continue;
      std::map<std::string, torch::Tensor> buffers;
      params[position(g, i)] = state_of(g, i, param, *found->second, buffers);
      for (auto& [key, tensor] : buffers) state.tensors[position(g, i) + "." + key] = std::move(tensor);
    }
  }
  state.values["groups"] = std::move(groups);
  state.values["params"] = std::move(params);
  return state;
}

}  // namespace detail

State save_optimizer_state(const torch::optim::Optimizer& optimizer) {
  // A capturable step counts on the device (Note [What a captured optimizer step reads]).
  if (const DeviceSideStep* device = device_side_step(optimizer); device != nullptr && device->capturable()) {
    device->sync_host_state();
  }
  State state;
  const bool typed = with_codec(optimizer, [&](auto codec, const char* type) {
    state = save_typed<decltype(codec)>(optimizer, type);
  });
  return typed ? state : detail::save_generic(optimizer);
}

void load_optimizer_state(torch::optim::Optimizer& optimizer, const State& state,
                          const std::vector<ParamGroupInfo>* groups) {
  try {
    const bool typed = with_codec(optimizer, [&](auto codec, const char* type) {
      load_typed<decltype(codec)>(optimizer, state, type, groups);
    });
    if (!typed) detail::load_generic(optimizer, state, groups);
  } catch (const json::exception& error) {
    // Only pass 1 reads JSON, so nothing has changed yet.
    LOCKSTEP_FAIL(kWhat, ": malformed checkpoint entry: ", error.what());
  }
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  const bool typed = with_codec(optimizer, [&](auto codec, const char*) {
    bytes = typed_bytes<decltype(codec)>(optimizer);
  });
  return typed ? bytes : detail::generic_bytes(optimizer);
}

}  // namespace lockstep
