#include "lockstep/compat/internal/optim.h"

#include <cmath>

#include <ATen/ATen.h>
#include <torch/version.h>

namespace lockstep::compat {

void adam_first_moment_(torch::Tensor& exp_avg, const torch::Tensor& grad, double beta1) {
#if TORCH_VERSION_MAJOR >= 2
  exp_avg.lerp_(grad, 1 - beta1);
#else
  exp_avg.mul_(beta1).add_(grad, 1 - beta1);
#endif
}

double adam_bias_correction2_sqrt(double bias_correction2) {
#if TORCH_VERSION_MAJOR >= 2
  return std::pow(bias_correction2, 0.5);  // Python's float ** 0.5 calls the C library's pow
#else
  return std::sqrt(bias_correction2);
#endif
}

bool optimizer_foreach_by_default(const std::vector<torch::Tensor>& params) {
#if TORCH_VERSION_MAJOR >= 2
  if (params.empty()) return false;
  for (const auto& param : params) {
    if (!param.is_cuda()) return false;
  }
  return true;
#else
  (void)params;
  return false;
#endif
}

bool clip_foreach_by_default() {
#if TORCH_VERSION_MAJOR >= 2
  return true;
#else
  return false;
#endif
}

void foreach_adam_first_moment_(at::TensorList exp_avgs, at::TensorList grads, double beta1) {
#if TORCH_VERSION_MAJOR >= 2
  at::_foreach_lerp_(exp_avgs, grads, 1 - beta1);
#else
  at::_foreach_mul_(exp_avgs, beta1);
  at::_foreach_add_(exp_avgs, grads, 1 - beta1);
#endif
}

void foreach_mul_(at::TensorList tensors, const torch::Tensor& factor) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  at::_foreach_mul_(tensors, factor);
#else
  for (const auto& tensor : tensors) tensor.mul_(factor);
#endif
}

std::string optimizer_archive_key(size_t ordinal) { return std::to_string(ordinal + 1); }

}  // namespace lockstep::compat
