#include "lockstep/compat/internal/optim.h"

#include <cmath>

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

std::string optimizer_archive_key(size_t ordinal) { return std::to_string(ordinal + 1); }

}  // namespace lockstep::compat
