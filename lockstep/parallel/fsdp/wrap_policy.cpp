#include "lockstep/parallel/fsdp/wrap_policy.h"

#include <cmath>
#include <unordered_set>

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>

#include "lockstep/core/error.h"
#include "lockstep/model/activation_checkpoint.h"

namespace lockstep {
namespace {

bool is_container_without_forward(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::ModuleListImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&module) != nullptr;
}

class SizeBasedPolicy : public WrapPolicy {
 public:
  explicit SizeBasedPolicy(int64_t min_num_params) : min_num_params_(min_num_params) {
    LOCKSTEP_CHECK(min_num_params_ > 0, "size_based wrap policy: min_num_params must be positive, got ",
                   min_num_params_);
  }
  bool should_wrap(const torch::nn::Module& module, const std::string&, int64_t unwrapped) const override {
    return unwrapped >= min_num_params_ && !is_container_without_forward(module);
  }
  std::string describe() const override { return str_cat("size_based(min_num_params=", min_num_params_, ")"); }

 private:
  int64_t min_num_params_;
};

class ModuleTypePolicy : public WrapPolicy {
 public:
  explicit ModuleTypePolicy(std::vector<std::string> names) : names_(std::move(names)) {
    LOCKSTEP_CHECK(!names_.empty(), "module_type wrap policy: module_types is empty");
  }
  bool should_wrap(const torch::nn::Module& module, const std::string&, int64_t) const override {
    const std::string name = module.name();
    for (const auto& wanted : names_) {
      if (module_type_matches(name, wanted)) return true;
    }
    return false;
  }
  std::string describe() const override {
    std::string text;
    for (const auto& name : names_) text += (text.empty() ? "" : ", ") + name;
    return "module_type(" + text + ")";
  }

 private:
  std::vector<std::string> names_;
};

class LambdaPolicy : public WrapPolicy {
 public:
  LambdaPolicy(std::function<bool(const torch::nn::Module&, const std::string&, int64_t)> predicate,
               std::string description)
      : predicate_(std::move(predicate)), description_(std::move(description)) {
    LOCKSTEP_CHECK(predicate_ != nullptr, "lambda_wrap_policy needs a predicate");
  }
  bool should_wrap(const torch::nn::Module& module, const std::string& path, int64_t unwrapped) const override {
    return predicate_(module, path, unwrapped);
  }
  std::string describe() const override { return description_; }

 private:
  std::function<bool(const torch::nn::Module&, const std::string&, int64_t)> predicate_;
  std::string description_;
};

// Reads 1e6 as well as 1000000 (YAML users write both).
int64_t read_count(const Config& config, const std::string& key, int64_t fallback) {
  if (config.child(key).is_null()) return fallback;
  const double value = config.get<double>(key);
  LOCKSTEP_CHECK(std::isfinite(value) && value == std::floor(value) && value > 0, config.where(key), ": ", key,
                 " must be a positive whole number, got ", config.at(key).text());
  return static_cast<int64_t>(value);
}

struct Selector {
  const WrapPolicy& policy;
  std::unordered_set<const torch::nn::Module*> seen;
  std::vector<std::string> units;

  // Returns the unwrapped trainable parameter elements of `module`'s subtree.
  int64_t visit(const torch::nn::Module& module, const std::string& path) {
    int64_t unwrapped = 0;
    for (const auto& param : module.named_parameters(/*recurse=*/false)) {
      if (param.value().requires_grad()) unwrapped += param.value().numel();
    }
    for (const auto& child : module.named_children()) {
      if (!seen.insert(child.value().get()).second) continue;
      const std::string child_path = path.empty() ? child.key() : path + "." + child.key();
      const int64_t below = visit(*child.value(), child_path);
      if (below > 0 && policy.should_wrap(*child.value(), child_path, below)) {
        units.push_back(child_path);
      } else {
        unwrapped += below;
      }
    }
    return unwrapped;
  }
};

}  // namespace

std::shared_ptr<WrapPolicy> size_based_wrap_policy(int64_t min_num_params) {
  return std::make_shared<SizeBasedPolicy>(min_num_params);
}

std::shared_ptr<WrapPolicy> module_type_wrap_policy(std::vector<std::string> type_names) {
  return std::make_shared<ModuleTypePolicy>(std::move(type_names));
}

std::shared_ptr<WrapPolicy> lambda_wrap_policy(
    std::function<bool(const torch::nn::Module&, const std::string&, int64_t)> predicate, std::string description) {
  return std::make_shared<LambdaPolicy>(std::move(predicate), std::move(description));
}

Registry<WrapPolicy>& fsdp_wrap_policy_registry() {
  static Registry<WrapPolicy> registry("FSDP wrap policy");
  return registry;
}

std::shared_ptr<WrapPolicy> build_wrap_policy(const Config& config) {
  if (config.is_null()) return nullptr;
  return fsdp_wrap_policy_registry().build_from_name_or_map(config);
}

std::vector<std::string> select_units(const torch::nn::Module& root, const WrapPolicy& policy) {
  Selector selector{policy, {&root}, {}};
  selector.visit(root, "");
  return selector.units;
}

// PyTorch's default_auto_wrap_policy threshold is 1e8 parameters.
LOCKSTEP_REGISTER(fsdp_wrap_policy_registry(), "size_based", [](const Config& config) {
  return size_based_wrap_policy(read_count(config, "min_num_params", 100'000'000));
});

LOCKSTEP_REGISTER(fsdp_wrap_policy_registry(), "module_type", [](const Config& config) {
  return module_type_wrap_policy(config.get<std::vector<std::string>>("module_types"));
});

}  // namespace lockstep
