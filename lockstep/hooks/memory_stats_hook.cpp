#include "lockstep/hooks/memory_stats_hook.h"

#include "lockstep/compat/cuda.h"
#include "lockstep/core/error.h"
#include "lockstep/core/process_memory.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {
namespace {
constexpr double kMiB = 1024.0 * 1024.0;
}  // namespace

MemoryStatsHook::MemoryStatsHook(int64_t interval, int cuda_device)
    : Hook("MemoryStatsHook"), interval_(interval), cuda_device_(cuda_device) {
  LOCKSTEP_CHECK(interval_ >= 1, "MemoryStatsHook: interval must be at least 1, got ", interval_);
}

void MemoryStatsHook::after_step() {
  if ((trainer().iter() + 1) % interval_ != 0 && trainer().iter() + 1 != trainer().max_iter()) return;
  EventStorage& storage = trainer().storage();
  const ProcessMemory memory = process_memory();
  if (memory.rss_bytes >= 0) storage.put_scalar("memory/rss_mib", memory.rss_bytes / kMiB, false);
  if (memory.peak_rss_bytes >= 0) storage.put_scalar("memory/peak_rss_mib", memory.peak_rss_bytes / kMiB, false);
  if (cuda_device_ < 0) return;
  if (auto cuda = compat::cuda_memory_stats(cuda_device_)) {
    storage.put_scalar("memory/cuda_allocated_mib", cuda->allocated / kMiB, false);
    storage.put_scalar("memory/cuda_reserved_mib", cuda->reserved / kMiB, false);
    storage.put_scalar("memory/cuda_peak_allocated_mib", cuda->peak_allocated / kMiB, false);
    storage.put_scalar("memory/cuda_peak_reserved_mib", cuda->peak_reserved / kMiB, false);
  }
}

LOCKSTEP_REGISTER(hook_registry(), "MemoryStatsHook", [](const Config& cfg, const HookContext& context) {
  const int64_t interval = cfg.get<int64_t>("interval", 50);
  LOCKSTEP_CHECK(interval >= 1, cfg.where("interval"), ": interval must be at least 1, got ", interval);
  const torch::Device device = context.strategy ? context.strategy->device() : torch::Device(torch::kCPU);
  return std::make_shared<MemoryStatsHook>(interval, device.is_cuda() ? device.index() : -1);
});

}  // namespace lockstep
