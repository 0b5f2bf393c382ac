#include "lockstep/amp/autocast.h"

#include "lockstep/compat/autocast.h"
#include "lockstep/core/error.h"

namespace lockstep {

void check_autocast_supported(c10::DeviceType device, torch::ScalarType dtype, const std::string& where) {
  const std::string prefix = where.empty() ? std::string() : where + ": ";
  if (device == c10::DeviceType::CPU) {
    LOCKSTEP_CHECK(dtype == torch::kBFloat16, prefix, "autocast on cpu runs in bfloat16 only, not ",
                   c10::toString(dtype), " (use dtype bf16)");
  } else if (device == c10::DeviceType::CUDA) {
    LOCKSTEP_CHECK(dtype == torch::kHalf || dtype == torch::kBFloat16, prefix,
                   "autocast on cuda runs in float16 or bfloat16, not ", c10::toString(dtype));
  } else {
    LOCKSTEP_FAIL(prefix, "autocast is supported on cpu and cuda only, not on ", c10::DeviceTypeName(device, true));
  }
}

AutocastGuard::AutocastGuard(c10::DeviceType device, torch::ScalarType dtype, bool enabled) : device_(device) {
  if (enabled) check_autocast_supported(device, dtype);
  previous_enabled_ = compat::autocast_enabled(device);
  previous_dtype_ = compat::autocast_dtype(device);
  compat::set_autocast_dtype(device, enabled ? dtype : previous_dtype_);
  compat::set_autocast_enabled(device, enabled);
  compat::increment_autocast_nesting();
}

AutocastGuard::~AutocastGuard() {
  // As torch.autocast.__exit__: the cache lives as long as the outermost region.
  if (compat::decrement_autocast_nesting() == 0) compat::clear_autocast_cache();
  compat::set_autocast_enabled(device_, previous_enabled_);
  compat::set_autocast_dtype(device_, previous_dtype_);
}

bool autocast_enabled(c10::DeviceType device) { return compat::autocast_enabled(device); }
torch::ScalarType autocast_dtype(c10::DeviceType device) { return compat::autocast_dtype(device); }

}  // namespace lockstep
