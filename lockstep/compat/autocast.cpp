#include "lockstep/compat/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "lockstep/core/error.h"

namespace lockstep::compat {

namespace {

void check_device(c10::DeviceType device) {
  LOCKSTEP_CHECK(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA,
                 "autocast is supported on cpu and cuda only, not on ", c10::DeviceTypeName(device, true));
}

}  // namespace

#if TORCH_VERSION_MAJOR >= 2

bool autocast_enabled(c10::DeviceType device) {
  check_device(device);
  return at::autocast::is_autocast_enabled(device);
}

void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  check_device(device);
  at::autocast::set_autocast_enabled(device, enabled);
}

c10::ScalarType autocast_dtype(c10::DeviceType device) {
  check_device(device);
  return at::autocast::get_autocast_dtype(device);
}

void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  check_device(device);
  at::autocast::set_autocast_dtype(device, dtype);
}

#else  // libtorch 1.13: one function per device

bool autocast_enabled(c10::DeviceType device) {
  check_device(device);
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}

void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  check_device(device);
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
}

c10::ScalarType autocast_dtype(c10::DeviceType device) {
  check_device(device);
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
}

void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  check_device(device);
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
}

#endif

int increment_autocast_nesting() { return at::autocast::increment_nesting(); }
int decrement_autocast_nesting() { return at::autocast::decrement_nesting(); }
void clear_autocast_cache() { at::autocast::clear_cache(); }

}  // namespace lockstep::compat
