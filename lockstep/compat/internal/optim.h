// Optimizer internals that differ between libtorch versions: how the
// per-parameter state map is keyed, how libtorch's optimizer archive names a
// parameter, and the arithmetic of Python's Adam.
//
// Note [Adam as Python computes it]
// libtorch's C++ torch::optim::Adam is a port of PyTorch 1.x's Python Adam and
// has not changed since. Python's Adam has (single-tensor path, the default on
// CPU): from 2.0 on the first moment is `exp_avg.lerp_(grad, 1 - beta1)`
// instead of `exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)`, and the
// square root of the second bias correction is `bias_correction2 ** 0.5`
// (the C library's pow) instead of `math.sqrt`. Each differs in the last bit
// of some elements, so an Adam that agrees bitwise with the Python optimizer
// users compare against must do what that version's Python does. These two
// functions are that version's choice; lockstep::Adam and lockstep::AdamW
// (optim/adam.h) are the only callers. Verified against PyTorch 1.13 and 2.6
// by the differential suite (tests/differential).
//
//   lockstep::compat::adam_first_moment_(exp_avg, grad, beta1);
//   const double denominator_scale = lockstep::compat::adam_bias_correction2_sqrt(1 - std::pow(beta2, step));
#pragma once

#include <sstream>
#include <string>
#include <type_traits>

#include <torch/types.h>

namespace lockstep::compat {

// exp_avg <- beta1 * exp_avg + (1 - beta1) * grad, with the operations of
// this libtorch version's Python Adam (Note [Adam as Python computes it]).
void adam_first_moment_(torch::Tensor& exp_avg, const torch::Tensor& grad, double beta1);

// sqrt(bias_correction2) as this version's Python Adam computes it.
double adam_bias_correction2_sqrt(double bias_correction2);

// The key of `param` in an optimizer's state map: libtorch keys the map by the
// parameter's TensorImpl, as a string of the pointer in 1.13 and as the
// pointer itself in 2.x. The key type is read off the map.
template <typename Map>
typename Map::key_type param_state_key(const Map&, const torch::Tensor& param) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // what libtorch 1.13 writes: operator<< of the pointer
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// The name of the parameter numbered `ordinal` in an archive in libtorch's
// optimizer format (torch/optim/serialize.h: the "state" sub-archive's keys
// and each group's "params/<i>"), which an optimizer's load() reads. 1.13
// takes any string; 2.x reads the name back with std::stoull as a TensorImpl
// address, so it must be a decimal number, distinct per parameter ("0.3"
// would read as 0, the same as "0.4"). A decimal serves both: ordinal + 1
// (never 0, which 2.x would make a null key).
std::string optimizer_archive_key(size_t ordinal);

}  // namespace lockstep::compat
