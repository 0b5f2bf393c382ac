#include "lockstep/hooks/sync_buffers_hook.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/model/model.h"  // IWYU pragma: keep (Model's torch::nn::Module members)

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
  const Collectives::TensorCollectives collectives = context.collectives->tensor_collectives();
  return std::make_shared<SyncBuffersHook>(mode == "mean", collectives.average, collectives.broadcast);
});

}  // namespace lockstep
