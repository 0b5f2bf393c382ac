#include "lockstep/hooks/sync_buffers_hook.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/model/model.h"
#include "lockstep/strategy/distributed_strategy.h"

namespace lockstep {

SyncBuffersHook::SyncBuffersHook(bool mean, std::function<void(torch::Tensor&)> average,
                                 std::function<void(torch::Tensor&)> broadcast)
    : Hook("SyncBuffersHook"), mean_(mean), average_(std::move(average)), broadcast_(std::move(broadcast)) {}

void SyncBuffersHook::sync() {
  if (!average_ || !broadcast_) return;
  torch::NoGradGuard no_grad;
  // Every rank walks the same buffers in the same order (the same model).
  for (const auto& item : trainer().model().named_buffers()) {
    torch::Tensor buffer = item.value();
    if (!buffer.defined() || buffer.numel() == 0) continue;
    torch::Tensor value = buffer.contiguous();
    if (mean_ && value.is_floating_point()) {
      average_(value);
    } else {
      broadcast_(value);
    }
    if (!value.is_same(buffer)) buffer.copy_(value);
  }
}

LOCKSTEP_REGISTER(hook_registry(), "SyncBuffersHook", [](const Config& cfg, const HookContext& context) {
  const auto mode = cfg.get<std::string>("mode", "mean");
  LOCKSTEP_CHECK(mode == "mean" || mode == "broadcast", cfg.where("mode"), ": mode is mean or broadcast, got '", mode,
                 "'");
  std::function<void(torch::Tensor&)> average, broadcast;
  if (auto* distributed = dynamic_cast<DistributedStrategy*>(context.strategy.get())) {
    std::shared_ptr<ProcessGroup> group = distributed->world_group();
    average = [group](torch::Tensor& tensor) { group->all_reduce(tensor, ReduceOp::kAvg); };
    broadcast = [group](torch::Tensor& tensor) { group->broadcast(tensor, /*root=*/0); };
  }
  return std::make_shared<SyncBuffersHook>(mode == "mean", average, broadcast);
});

}  // namespace lockstep
