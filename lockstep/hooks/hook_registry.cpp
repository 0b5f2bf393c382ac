#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

Registry<Hook, const HookContext&>& hook_registry() {
  static Registry<Hook, const HookContext&> registry("hook");
  return registry;
}

}  // namespace lockstep
