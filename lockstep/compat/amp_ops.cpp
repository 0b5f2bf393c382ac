#include "lockstep/compat/amp_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <limits>

#include "lockstep/core/error.h"

namespace lockstep::compat {

namespace {

bool dispatcher_has_kernels(c10::DispatchKey key) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const char* name : {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"}) {
    auto op = dispatcher.findOp(c10::OperatorName(name, ""));
    if (!op || !op->hasKernelForDispatchKey(key)) return false;
  }
  return true;
}

bool use_fused(c10::DeviceType device, AmpKernels kernels, const char* what) {
  if (kernels == AmpKernels::kPortable) return false;
  const bool fused = has_fused_amp_kernels(device);
  LOCKSTEP_CHECK(fused || kernels == AmpKernels::kAuto, "this libtorch (", TORCH_VERSION,
                 ") has no fused ", what, " kernel for ", c10::DeviceTypeName(device, true));
  return fused;
}

void check_one_element(const torch::Tensor& t, torch::ScalarType dtype, const char* name) {
  LOCKSTEP_CHECK(t.defined() && t.numel() == 1 && t.scalar_type() == dtype, name, " must be a one-element ",
                 c10::toString(dtype), " tensor, got ",
                 t.defined() ? str_cat(c10::toString(t.scalar_type()), " of shape ", t.sizes()) : std::string("none"));
}

}  // namespace

bool has_fused_amp_kernels(c10::DeviceType device) {
  static const bool cpu = dispatcher_has_kernels(c10::DispatchKey::CPU);
  static const bool cuda = dispatcher_has_kernels(c10::DispatchKey::CUDA);
  if (device == c10::DeviceType::CPU) return cpu;
  if (device == c10::DeviceType::CUDA) return cuda;
  return false;
}

void non_finite_check_and_unscale(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf,
                                  const torch::Tensor& inv_scale, AmpKernels kernels) {
  check_one_element(found_inf, torch::kFloat, "found_inf");
  check_one_element(inv_scale, torch::kFloat, "inv_scale");
  if (grads.empty()) return;
  for (const auto& g : grads) {
    LOCKSTEP_CHECK(g.device() == found_inf.device(), "a gradient on ", g.device(),
                   " cannot be unscaled with found_inf on ", found_inf.device());
  }
  if (use_fused(found_inf.device().type(), kernels, "_amp_foreach_non_finite_check_and_unscale_")) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return;
  }
  // Checked before scaling, as the fused kernel does: a scale below 1 could
  // turn a large finite gradient into inf, which is not an overflow of the
  // scaled backward and must not skip the step.
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> finite;
  finite.reserve(grads.size());
  for (const auto& g : grads) finite.push_back(torch::isfinite(g).all());
  torch::Tensor any_bad = torch::logical_not(torch::stack(finite).all()).to(torch::kFloat).reshape_as(found_inf);
  found_inf.copy_(torch::maximum(found_inf, any_bad));
  // Multiplying by a float32 value in each grad's own dtype, as the fused kernel does.
  const double factor = inv_scale.item<float>();
  for (auto g : grads) g.mul_(factor);
}

void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval, AmpKernels kernels) {
  check_one_element(scale, torch::kFloat, "scale");
  check_one_element(growth_tracker, torch::kInt, "growth_tracker");
  check_one_element(found_inf, torch::kFloat, "found_inf");
  LOCKSTEP_CHECK(growth_interval >= 1, "growth_interval must be at least 1, got ", growth_interval);
  if (use_fused(scale.device().type(), kernels, "_amp_update_scale_")) {
    at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval);
    return;
  }
  // On the host: this path runs where there is no fused kernel, i.e. on CPU.
  const float current = scale.item<float>();
  int64_t tracker = growth_tracker.item<int>();
  float next = current;
  if (found_inf.item<float>() != 0.0f) {
    next = static_cast<float>(static_cast<double>(current) * backoff_factor);
    tracker = 0;
  } else if (tracker + 1 == growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(current) * growth_factor);
    if (std::isfinite(grown)) next = grown;  // never grow past float32's range
    tracker = 0;
  } else {
    tracker += 1;
  }
  scale.fill_(next);
  growth_tracker.fill_(tracker);
}

}  // namespace lockstep::compat
