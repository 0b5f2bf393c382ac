#include "lockstep/parallel/fsdp/internal/memory_meter.h"

#include <algorithm>

#include "lockstep/optim/optimizer_state.h"

namespace lockstep::fsdp {

void MemoryMeter::count_optimizer() {
  if (!optimizer_) return;
  // Counting may serialise the state (optimizer types without a typed codec),
  // so only when it gained or lost parameters: optimizers create a
  // parameter's buffers together, on its first step.
  const std::pair<const void*, size_t> counted{optimizer_.get(), optimizer_->state().size()};
  if (counted == optimizer_counted_) return;
  stats_.optimizer = optimizer_state_bytes(*optimizer_);
  optimizer_counted_ = counted;
}

void MemoryMeter::sample() {
  int64_t params = 0;
  int64_t grads = 0;
  for (const auto& unit : model_.units) {
    params += unit->shard().numel() * unit->shard().element_size() + unit->gathered_bytes();
    grads += unit->gradients().bytes();
  }
  for (const auto& [name, param] : model_.frozen) params += param.numel() * param.element_size();
  stats_.params = params;
  stats_.grads = grads;
  stats_.peak_params = std::max(stats_.peak_params, params);
  stats_.peak_grads = std::max(stats_.peak_grads, grads);
  stats_.peak_optimizer = std::max(stats_.peak_optimizer, stats_.optimizer);
  stats_.peak_total = std::max(stats_.peak_total, params + grads + stats_.optimizer);
}

void MemoryMeter::note_gathered(int gathered) {
  stats_.max_gathered_units = std::max(stats_.max_gathered_units, gathered);
}

void MemoryMeter::reset_peaks(int gathered) {
  stats_.peak_params = stats_.peak_grads = stats_.peak_optimizer = stats_.peak_total = 0;
  stats_.max_gathered_units = gathered;
  sample();
}

}  // namespace lockstep::fsdp
