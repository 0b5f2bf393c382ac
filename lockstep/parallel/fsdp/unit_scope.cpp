#include "lockstep/parallel/fsdp/unit_scope.h"

#include <mutex>
#include <unordered_map>
#include <utility>

#include "lockstep/core/error.h"

namespace lockstep::fsdp {
namespace detail {
namespace {

struct Entry {
  UnitRuntime* runtime;
  int unit;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::unordered_map<const torch::nn::Module*, Entry>& registry() {
  static std::unordered_map<const torch::nn::Module*, Entry> map;
  return map;
}

}  // namespace

void register_unit(const torch::nn::Module* module, UnitRuntime* runtime, int unit) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto [it, inserted] = registry().emplace(module, Entry{runtime, unit});
  LOCKSTEP_CHECK(inserted || it->second.runtime == runtime, "FSDP: module ", module->name(),
                 " is already a unit of another FullyShardedDataParallel; wrap each module once");
  it->second = Entry{runtime, unit};
}

void unregister_units(const UnitRuntime* runtime) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (auto it = registry().begin(); it != registry().end();) {
    it = it->second.runtime == runtime ? registry().erase(it) : std::next(it);
  }
}

bool find_unit(const torch::nn::Module* module, Entry* entry) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto found = registry().find(module);
  if (found == registry().end()) return false;
  *entry = found->second;
  return true;
}

}  // namespace detail

UnitScope::UnitScope(detail::UnitRuntime* runtime, int unit) : runtime_(runtime), unit_(unit) {
  runtime_->enter_unit(unit_);
}

UnitScope::UnitScope(UnitScope&& other) noexcept : runtime_(other.runtime_), unit_(other.unit_) {
  other.runtime_ = nullptr;
}

UnitScope::~UnitScope() {
  if (runtime_ != nullptr) runtime_->leave_unit(unit_);
}

torch::Tensor UnitScope::output(torch::Tensor output) {
  if (runtime_ == nullptr) return output;
  return runtime_->register_output(unit_, output);
}

std::vector<torch::Tensor> UnitScope::output(std::vector<torch::Tensor> outputs) {
  if (runtime_ != nullptr) {
    for (auto& output : outputs) output = runtime_->register_output(unit_, output);
  }
  return outputs;
}

torch::Tensor UnitScope::input(torch::Tensor input) {
  if (runtime_ != nullptr) runtime_->register_input(unit_, input);
  return input;
}

UnitScope unit_scope(const torch::nn::Module& module) {
  detail::Entry entry{nullptr, -1};
  if (!detail::find_unit(&module, &entry)) return UnitScope();
  return UnitScope(entry.runtime, entry.unit);
}

}  // namespace lockstep::fsdp
