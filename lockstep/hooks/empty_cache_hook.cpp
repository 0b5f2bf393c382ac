#include "lockstep/hooks/empty_cache_hook.h"

#include "lockstep/compat/cuda.h"
#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

EmptyCacheHook::EmptyCacheHook(bool before_epoch, bool after_epoch, bool after_iter)
    : Hook("EmptyCacheHook"), before_epoch_(before_epoch), after_epoch_(after_epoch), after_iter_(after_iter) {}

void EmptyCacheHook::empty() {
  compat::empty_cuda_cache();
  ++calls_;
}

void EmptyCacheHook::before_train_epoch() {
  if (before_epoch_) empty();
}

void EmptyCacheHook::after_train_epoch() {
  if (after_epoch_) empty();
}

void EmptyCacheHook::after_step() {
  if (after_iter_) empty();
}

void EmptyCacheHook::after_val_epoch(const std::map<std::string, double>&) {
  if (after_epoch_) empty();
}

void EmptyCacheHook::after_test_epoch(const std::map<std::string, double>&) {
  if (after_epoch_) empty();
}

LOCKSTEP_REGISTER(hook_registry(), "EmptyCacheHook", [](const Config& cfg, const HookContext&) {
  return std::make_shared<EmptyCacheHook>(cfg.get<bool>("before_epoch", false), cfg.get<bool>("after_epoch", true),
                                          cfg.get<bool>("after_iter", false));
});

}  // namespace lockstep
