// The autocast seam: libtorch 1.13 has one pair of functions per device
// (at::autocast::set_cpu_enabled, set_autocast_gpu_dtype, ...); 2.x has
// device-generic ones (set_autocast_enabled(device, on), set_autocast_dtype)
// and deprecates the old. lockstep::AutocastGuard (amp/autocast.h) is written
// against these, so it reads the same on both.
//
//   bool was = lockstep::compat::autocast_enabled(c10::DeviceType::CPU);
//   lockstep::compat::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
//   lockstep::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
//   lockstep::compat::increment_autocast_nesting();
//   ... ops ...
//   if (lockstep::compat::decrement_autocast_nesting() == 0) lockstep::compat::clear_autocast_cache();
//
// Only CPU and CUDA are supported; any other device type throws.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace lockstep::compat {

// Autocast state is thread-local (a dispatch key excluded or not on this thread).
bool autocast_enabled(c10::DeviceType device);
void set_autocast_enabled(c10::DeviceType device, bool enabled);
// The lower-precision type autocast casts to on `device`.
c10::ScalarType autocast_dtype(c10::DeviceType device);
void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype);

// The nesting depth of autocast regions on this thread (shared by all
// devices, as in torch.autocast). Each returns the new depth.
int increment_autocast_nesting();
int decrement_autocast_nesting();
// Drops the cached lower-precision copies of weights (autocast casts each
// fp32 leaf that requires grad once per region and reuses the copy). Must run
// when the outermost region ends, or the next region computes with the
// weights as they were before the optimizer stepped.
void clear_autocast_cache();

}  // namespace lockstep::compat
