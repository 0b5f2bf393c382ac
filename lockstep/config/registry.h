// Registry: builds components by name from `{type: Name, ...}` config maps.
//
// Each kind of component (models, datasets, optimizers, schedulers, hooks,
// model wrappers, wrap policies, ...) has one registry, reached through a
// function so registration order across files does not matter:
//
//   lockstep::Registry<Model>& model_registry();  // declared in model/model.h
//
//   // In any .cpp (yours too), at namespace scope:
//   LOCKSTEP_REGISTER(lockstep::model_registry(), "MyNet",
//                     [](const lockstep::Config& cfg) {
//                       return std::make_shared<MyNet>(cfg.get<int>("hidden", 128));
//                     });
//
//   auto model = lockstep::model_registry().build(cfg.at("model"));
//
// build() reads `type` (build_from_name_or_map also takes a bare name where a
// component has no options to give), reports an unknown type with the list of registered
// names, adds the config location to any error the factory raises, and then
// rejects keys the factory never read (so a typo is an error, not a silence).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"

namespace lockstep {

template <typename Product, typename... Args>
class Registry {
 public:
  using Factory = std::function<std::shared_ptr<Product>(const Config&, Args...)>;

  // `kind` names the component in messages: "model", "optimizer", ...
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  void add(const std::string& name, Factory factory) {
    LOCKSTEP_CHECK(!name.empty(), "cannot register a ", kind_, " with an empty name");
    LOCKSTEP_CHECK(factories_.count(name) == 0, kind_, " type '", name, "' is registered twice");
    factories_.emplace(name, std::move(factory));
  }

  bool contains(const std::string& name) const { return factories_.count(name) > 0; }

  std::vector<std::string> names() const {
    std::vector<std::string> result;
    for (const auto& entry : factories_) result.push_back(entry.first);
    return result;
  }

  const std::string& kind() const { return kind_; }

  // Builds from a map with a `type` key.
  std::shared_ptr<Product> build(const Config& config, Args... args) const {
    LOCKSTEP_CHECK(config.is_map(), config.where(), ": a ", kind_,
                   " is configured as a map with a 'type' key");
    const std::string type = config.get<std::string>("type");
    return build_as(type, config, std::forward<Args>(args)...);
  }

  // Builds from a bare name with no options (`comm_hook: fp16_compress`) or
  // from a map with a `type` key (`comm_hook: {type: powerSGD, rank: 2}`).
  std::shared_ptr<Product> build_from_name_or_map(const Config& config, Args... args) const {
    if (!config.is_scalar()) return build(config, std::forward<Args>(args)...);
    const std::string type = config.as<std::string>();
    check_known(type, config.where());
    return build_as(type, Config::map(), std::forward<Args>(args)...);
  }

  // Builds `type` from `config` (which need not carry a `type` key).
  std::shared_ptr<Product> build_as(const std::string& type, const Config& config, Args... args) const {
    check_known(type, config.where("type"));
    auto found = factories_.find(type);
    std::shared_ptr<Product> product;
    try {
      product = found->second(config, std::forward<Args>(args)...);
    } catch (const Error&) {
      throw;  // already carries its location
    } catch (...) {
      rethrow_with_context(str_cat(config.where(), ": building ", kind_, " '", type, "'"));
    }
    LOCKSTEP_CHECK(product != nullptr, config.where(), ": the factory of ", kind_, " '", type,
                   "' returned nothing");
    check_all_used(config, str_cat(kind_, " '", type, "'"));
    return product;
  }

 private:
  void check_known(const std::string& type, const std::string& where) const {
    if (contains(type)) return;
    std::string known;
    for (const auto& entry : factories_) known += (known.empty() ? "" : ", ") + entry.first;
    LOCKSTEP_FAIL(where, ": unknown ", kind_, " type '", type, "'; registered ", kind_,
                  " types: ", known.empty() ? "(none)" : known);
  }

  std::string kind_;
  std::map<std::string, Factory> factories_;
};

// Registers at static-initialisation time; see LOCKSTEP_REGISTER.
struct Registrar {
  template <typename RegistryT, typename FactoryT>
  Registrar(RegistryT& registry, const std::string& name, FactoryT&& factory) {
    registry.add(name, std::forward<FactoryT>(factory));
  }
};

}  // namespace lockstep

#define LOCKSTEP_CONCAT_INNER(a, b) a##b
#define LOCKSTEP_CONCAT(a, b) LOCKSTEP_CONCAT_INNER(a, b)
#define LOCKSTEP_REGISTER(registry, name, ...)                                   \
  static const ::lockstep::Registrar LOCKSTEP_CONCAT(lockstep_registrar_, __COUNTER__)( \
      registry, name, __VA_ARGS__)
