#include "lockstep/core/rng.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep {

void seed_everything(uint64_t seed) { torch::manual_seed(seed); }

State capture_rng_state() {
  State state;
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  state.tensors["cpu"] = generator.get_state();
  return state;
}

void restore_rng_state(const State& state) {
  auto found = state.tensors.find("cpu");
  if (found == state.tensors.end()) return;
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  try {
    generator.set_state(found->second);
  } catch (...) {
    rethrow_with_context("restoring the CPU random number generator state from the checkpoint");
  }
}

}  // namespace lockstep
