// Wrap policies: which submodules of a model become FSDP units.
//
// A unit is gathered, used and freed as one flat parameter, so units bound
// the memory a rank holds at once. The policy is asked about each module,
// children before parents (PyTorch's recursive auto-wrap): a module becomes
// a unit when should_wrap() says so, and its parameters are then no longer
// "unwrapped" for its ancestors. The model itself is the root unit and holds
// whatever no unit claimed (Note [The root unit] in unit_builder.cpp).
//
//   auto by_size = lockstep::size_based_wrap_policy(1'000'000);
//   auto blocks = lockstep::module_type_wrap_policy({"Block"});   // Module::name(), e.g. "gpt::Block"
//   auto mine = lockstep::lambda_wrap_policy(
//       [](const torch::nn::Module& m, const std::string& path, int64_t unwrapped) {
//         return path.rfind("encoder.", 0) == 0 && unwrapped > 0;
//       });
//
// From config (mmengine's FSDP_WRAP_POLICIES registry, by name):
//   auto_wrap_policy: size_based                                 # default min_num_params 1e8
//   auto_wrap_policy: {type: size_based, min_num_params: 1e6}
//   auto_wrap_policy: {type: module_type, module_types: [Block, torch::nn::LinearImpl]}
// Register your own with
//   LOCKSTEP_REGISTER(lockstep::fsdp_wrap_policy_registry(), "my_policy",
//                     [](const lockstep::Config& cfg) { return lockstep::lambda_wrap_policy(...); });
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "lockstep/config/registry.h"

namespace lockstep {

class WrapPolicy {
 public:
  virtual ~WrapPolicy() = default;
  // Whether `module` (at dotted `path` in the model) becomes its own unit.
  // `unwrapped_params`: trainable parameter elements in its subtree that no
  // unit below it claimed.
  virtual bool should_wrap(const torch::nn::Module& module, const std::string& path,
                           int64_t unwrapped_params) const = 0;
  // For logs: "size_based(min_num_params=1000000)".
  virtual std::string describe() const = 0;
};

// Wraps a module once its unwrapped parameters reach `min_num_params`
// (PyTorch's size_based_auto_wrap_policy; ModuleList and ModuleDict are never
// units themselves, since they have no forward to intercept).
std::shared_ptr<WrapPolicy> size_based_wrap_policy(int64_t min_num_params);
// Wraps every module whose Module::name() is one of `type_names`, matched in
// full or by its last "::" component, with or without libtorch's "Impl"
// suffix ("Linear" matches torch::nn::LinearImpl).
std::shared_ptr<WrapPolicy> module_type_wrap_policy(std::vector<std::string> type_names);
std::shared_ptr<WrapPolicy> lambda_wrap_policy(
    std::function<bool(const torch::nn::Module&, const std::string&, int64_t)> predicate,
    std::string description = "custom");

// Name -> policy, built from the policy's config map ("type" plus arguments).
Registry<WrapPolicy>& fsdp_wrap_policy_registry();
// `auto_wrap_policy:` as a name or a map; null gives nullptr (no units but the root).
std::shared_ptr<WrapPolicy> build_wrap_policy(const Config& config);

// The dotted paths of the units `policy` picks in `root` (children before
// parents; the root itself is never in the list). A module reachable under
// two paths is considered once, under the first.
std::vector<std::string> select_units(const torch::nn::Module& root, const WrapPolicy& policy);

}  // namespace lockstep
