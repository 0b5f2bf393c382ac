#include "lockstep/parallel/fsdp/shard_while_building.h"

#include <limits>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "lockstep/core/error.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/fsdp/flat_param.h"

namespace lockstep::fsdp {
namespace {

thread_local std::optional<ShardPlan> active_plan;

std::mutex& prebuilt_mutex() {
  static std::mutex mutex;
  return mutex;
}

// A shard waits here for FSDP. The weak reference tells a module that is
// gone (never wrapped) from a new one at the same address.
struct Waiting {
  std::weak_ptr<torch::nn::Module> module;
  PrebuiltShard shard;
};

std::unordered_map<const torch::nn::Module*, Waiting>& prebuilt() {
  static std::unordered_map<const torch::nn::Module*, Waiting> shards;
  return shards;
}

// The entry for `module` if it is still that module's; callers hold the mutex.
std::unordered_map<const torch::nn::Module*, Waiting>::iterator find_waiting(const torch::nn::Module* module) {
  auto found = prebuilt().find(module);
  if (found != prebuilt().end() && found->second.module.lock().get() != module) {
    prebuilt().erase(found);
    return prebuilt().end();
  }
  return found;
}

}  // namespace

ShardWhileBuilding::ShardWhileBuilding(ShardPlan plan) {
  LOCKSTEP_CHECK(!active_plan, "ShardWhileBuilding: a scope is already open on this thread");
  LOCKSTEP_CHECK(plan.shard_world >= 1 && plan.shard_rank >= 0 && plan.shard_rank < plan.shard_world,
                 "ShardWhileBuilding: shard rank ", plan.shard_rank, " of ", plan.shard_world);
  active_plan = std::move(plan);
}

ShardWhileBuilding::~ShardWhileBuilding() { active_plan.reset(); }

void detail::shard_now(const std::shared_ptr<torch::nn::Module>& module) {
  if (!active_plan) return;
  torch::nn::Module& unit = *module;
  const ShardPlan& plan = *active_plan;
  torch::NoGradGuard no_grad;
  PrebuiltShard result;
  result.plan = plan;
  std::vector<torch::Tensor> params;
  std::unordered_set<const void*> seen;
  int64_t numel = 0;
  for (const auto& item : unit.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& param = item.value();
    if (!param.requires_grad() || !seen.insert(param.unsafeGetTensorImpl()).second) continue;
    LOCKSTEP_CHECK(params.empty() || (param.scalar_type() == params.front().scalar_type() &&
                                      param.device() == params.front().device()),
                   "shard_when_built(", unit.name(), "): the trainable parameters of a unit must have one dtype and "
                   "device; ", item.key(), " is ", param.scalar_type(), " on ", param.device(), " but ",
                   result.params.front().first, " is ", params.front().scalar_type(), " on ", params.front().device());
    params.push_back(param);
    result.params.emplace_back(item.key(), param.sizes().vec());
    numel += param.numel();
  }
  if (params.empty()) return;
  const int64_t shard_numel = fsdp::shard_numel(numel, plan.shard_world);
  // Parameter by parameter: broadcast from rank 0 (on the compute device),
  // the part that falls in this rank's shard copied out, then released. The
  // flat parameter is never assembled: the unit exists once, as its
  // constructor made it, and shrinks to the shard.
  result.shard = torch::zeros({shard_numel}, params.front().options().device(plan.shard_device).requires_grad(false));
  int64_t offset = 0;
  for (auto& param : params) {
    const int64_t count = param.numel();
    // In place where the parameter already is on the compute device: it is released next.
    torch::Tensor values = param.detach().reshape(-1).to(plan.compute_device).contiguous();
    if (plan.sync_group && plan.sync_group->size() > 1) plan.sync_group->broadcast(values, 0);
    const ShardOverlap part = shard_overlap(offset, count, plan.shard_rank, shard_numel);
    if (part.length > 0) {
      result.shard.narrow(0, part.in_shard, part.length).copy_(values.narrow(0, part.in_range, part.length));
    }
    values = torch::Tensor();
    param.set_data(torch::full({1}, std::numeric_limits<double>::quiet_NaN(), param.options()).expand(param.sizes()));
    offset += count;
  }
  std::lock_guard<std::mutex> lock(prebuilt_mutex());
  for (auto it = prebuilt().begin(); it != prebuilt().end();) {  // shards of modules that are gone
    it = it->second.module.expired() ? prebuilt().erase(it) : std::next(it);
  }
  prebuilt()[module.get()] = Waiting{module, std::move(result)};
}

bool has_prebuilt_shard(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(prebuilt_mutex());
  return find_waiting(module) != prebuilt().end();
}

std::optional<PrebuiltShard> take_prebuilt_shard(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(prebuilt_mutex());
  auto found = find_waiting(module);
  if (found == prebuilt().end()) return std::nullopt;
  PrebuiltShard shard = std::move(found->second.shard);
  prebuilt().erase(found);
  return shard;
}

}  // namespace lockstep::fsdp
