// The loss scaler's two kernels, fused where libtorch has them and written in
// ordinary tensor ops where it does not.
//
// libtorch ships `_amp_foreach_non_finite_check_and_unscale_` and
// `_amp_update_scale_` for CUDA, and for CPU only from 2.x on (1.13 has no CPU
// kernels). Whether a device has them is asked of the dispatcher once, so the
// same source runs everywhere; the portable versions compute the same values
// (the same float32 products, the same check on the unscaled values).
//
//   torch::Tensor found_inf = torch::zeros({1});                 // float32, grads' device
//   torch::Tensor inv_scale = torch::full({1}, 1.0f / 65536);
//   lockstep::compat::non_finite_check_and_unscale(grads, found_inf, inv_scale);
//   lockstep::compat::update_scale(scale, growth_tracker, found_inf, 2.0, 0.5, 2000);
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace lockstep::compat {

// kAuto: fused where the device has the kernels, else portable. kFused
// throws where they are missing; kPortable always works (tests compare them).
enum class AmpKernels { kAuto, kFused, kPortable };

// Whether libtorch has both fused scaler kernels for `device`.
bool has_fused_amp_kernels(c10::DeviceType device);

// Multiplies every tensor of `grads` by `inv_scale` in place and sets
// `found_inf` to 1 if any element (before scaling) is inf or NaN; `found_inf`
// is never reset, so several calls accumulate. `found_inf` and `inv_scale`
// are one-element float32 tensors on the grads' device; grads may mix dtypes.
void non_finite_check_and_unscale(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf,
                                  const torch::Tensor& inv_scale, AmpKernels kernels = AmpKernels::kAuto);

// Dynamic loss-scale update, in place (torch.amp's rule): if `found_inf` is
// nonzero, scale *= backoff_factor and growth_tracker = 0; else the tracker
// counts one more clean step, and on reaching growth_interval the scale grows
// by growth_factor (unless that would leave float32's range) and the tracker
// restarts at 0. `scale` is a one-element float32 tensor, `growth_tracker` a
// one-element int32 tensor, `found_inf` a one-element float32 tensor, all on
// one device.
void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval,
                  AmpKernels kernels = AmpKernels::kAuto);

}  // namespace lockstep::compat
