#include "lockstep/optim/param_groups.h"

#include <optional>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

namespace optim = torch::optim;

// Which options an options struct has is read off its members, so one
// template serves every optimizer type instead of one switch per type.
template <typename O, typename = void>
struct HasMomentum : std::false_type {};
template <typename O>
struct HasMomentum<O, std::void_t<decltype(std::declval<O&>().momentum())>> : std::true_type {};
template <typename O, typename = void>
struct HasBetas : std::false_type {};
template <typename O>
struct HasBetas<O, std::void_t<decltype(std::declval<O&>().betas())>> : std::true_type {};
template <typename O, typename = void>
struct HasWeightDecay : std::false_type {};
template <typename O>
struct HasWeightDecay<O, std::void_t<decltype(std::declval<O&>().weight_decay())>>
    : std::true_type {};

// Reads `option` of `o`, first writing `new_value` when given; nullopt when
// the type has no such option.
template <typename O>
std::optional<double> access(O& o, const std::string& option, const double* new_value) {
  if (option == "lr") {
    if (new_value) o.lr(*new_value);
    return o.lr();
  }
  if (option == "momentum") {
    if constexpr (HasMomentum<O>::value) {
      if (new_value) o.momentum(*new_value);
      return o.momentum();
    } else if constexpr (HasBetas<O>::value) {
      auto& betas = o.betas();
      if (new_value) std::get<0>(betas) = *new_value;
      return std::get<0>(betas);
    }
    return std::nullopt;
  }
  if (option == "weight_decay") {
    if constexpr (HasWeightDecay<O>::value) {
      if (new_value) o.weight_decay(*new_value);
      return o.weight_decay();
    }
    return std::nullopt;
  }
  return std::nullopt;
}

// Calls f(typed options) for the option types lockstep knows; sets *known to
// false (and returns nullopt) for any other type. By type, because libtorch's
// options expose only lr virtually (Note [Why the optimizer code asks for
// types] in optimizer_state.cpp).
template <typename F>
std::optional<double> visit(optim::OptimizerOptions& options, F&& f, bool* known) {
  *known = true;
  if (auto* o = dynamic_cast<optim::SGDOptions*>(&options)) return f(*o);
  if (auto* o = dynamic_cast<optim::AdamOptions*>(&options)) return f(*o);
  if (auto* o = dynamic_cast<optim::AdamWOptions*>(&options)) return f(*o);
  if (auto* o = dynamic_cast<optim::RMSpropOptions*>(&options)) return f(*o);
  if (auto* o = dynamic_cast<optim::AdagradOptions*>(&options)) return f(*o);
  if (auto* o = dynamic_cast<optim::LBFGSOptions*>(&options)) return f(*o);
  *known = false;
  return std::nullopt;
}

const char* const kOptionNames[] = {"lr", "momentum", "weight_decay"};

bool is_option_name(const std::string& option) {
  for (const char* name : kOptionNames) {
    if (option == name) return true;
  }
  return false;
}

// Reads (and, with new_value, writes) one option; nullopt when the type lacks it.
// Options of unknown optimizer types expose only lr, through libtorch's
// virtual get_lr/set_lr.
std::optional<double> access_any(const optim::OptimizerOptions& options, const std::string& option,
                                 const double* new_value) {
  // Writing goes through the same path as reading, so constness is dropped
  // once here; callers that only read pass new_value == nullptr.
  auto& mutable_options = const_cast<optim::OptimizerOptions&>(options);
  bool known = false;
  std::optional<double> result = visit(
      mutable_options, [&](auto& typed) { return access(typed, option, new_value); }, &known);
  if (known || option != "lr") return result;
  try {
    if (new_value) mutable_options.set_lr(*new_value);
    return mutable_options.get_lr();
  } catch (const c10::Error&) {
    return std::nullopt;  // the type does not override get_lr/set_lr
  }
}

// The optimizer that options of this type belong to; "" for types lockstep
// does not know.
std::string known_type_name(const optim::OptimizerOptions& options) {
  if (dynamic_cast<const optim::SGDOptions*>(&options)) return "SGD";
  if (dynamic_cast<const optim::AdamOptions*>(&options)) return "Adam";
  if (dynamic_cast<const optim::AdamWOptions*>(&options)) return "AdamW";
  if (dynamic_cast<const optim::RMSpropOptions*>(&options)) return "RMSprop";
  if (dynamic_cast<const optim::AdagradOptions*>(&options)) return "Adagrad";
  if (dynamic_cast<const optim::LBFGSOptions*>(&options)) return "LBFGS";
  return "";
}

std::string options_type_name(const optim::OptimizerOptions& options) {
  std::string name = known_type_name(options);
  return name.empty() ? "the optimizer with options " + c10::demangle(typeid(options).name()) : name;
}

const optim::OptimizerOptions& representative_options(const optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  if (!groups.empty() && groups.front().has_options()) return groups.front().options();
  return optimizer.defaults();
}

std::string options_listing(const optim::OptimizerOptions& options) {
  std::string listing;
  for (const char* name : kOptionNames) {
    if (access_any(options, name, nullptr)) listing += (listing.empty() ? "" : ", ") + std::string(name);
  }
  return listing.empty() ? "none of lr, momentum, weight_decay" : listing;
}

double access_checked(const optim::OptimizerParamGroup& group, const std::string& option,
                      const double* new_value) {
  LOCKSTEP_CHECK(is_option_name(option), "unknown parameter-group option '", option,
                 "'; lockstep schedules lr, momentum and weight_decay");
  LOCKSTEP_CHECK(group.has_options(), "a parameter group has no options yet (add it to an optimizer first)");
  const auto& options = group.options();
  std::optional<double> value = access_any(options, option, new_value);
  LOCKSTEP_CHECK(value.has_value(), options_type_name(options), " has no option '", option,
                 "' (its options: ", options_listing(options), ")");
  return *value;
}

const optim::OptimizerParamGroup& checked_group(const optim::Optimizer& optimizer, size_t group) {
  const auto& groups = optimizer.param_groups();
  LOCKSTEP_CHECK(group < groups.size(), optimizer_type_name(optimizer), " has ", groups.size(),
                 " parameter group(s); there is no group ", group);
  return groups[group];
}

}  // namespace

std::string optimizer_type_name(const torch::optim::Optimizer& optimizer) {
  // Every libtorch optimizer keeps its defaults in its own options type.
  std::string name = known_type_name(optimizer.defaults());
  return name.empty() ? c10::demangle(typeid(optimizer).name()) : name;
}

bool has_group_option(const torch::optim::Optimizer& optimizer, const std::string& option) {
  return is_option_name(option) &&
         access_any(representative_options(optimizer), option, nullptr).has_value();
}

double get_group_option(const torch::optim::Optimizer& optimizer, size_t group,
                        const std::string& option) {
  return access_checked(checked_group(optimizer, group), option, nullptr);
}

void set_group_option(torch::optim::Optimizer& optimizer, size_t group, const std::string& option,
                      double value) {
  access_checked(checked_group(optimizer, group), option, &value);
}

double get_group_option(const torch::optim::OptimizerParamGroup& group, const std::string& option) {
  return access_checked(group, option, nullptr);
}

void set_group_option(torch::optim::OptimizerParamGroup& group, const std::string& option,
                      double value) {
  access_checked(group, option, &value);
}

std::vector<double> get_group_options(const torch::optim::Optimizer& optimizer,
                                      const std::string& option) {
  std::vector<double> values;
  for (size_t group = 0; group < optimizer.param_groups().size(); ++group) {
    values.push_back(get_group_option(optimizer, group, option));
  }
  return values;
}

}  // namespace lockstep
