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
#include <vector>

#include <torch/types.h>

namespace lockstep::compat {

// exp_avg <- beta1 * exp_avg + (1 - beta1) * grad, with the operations of
// this libtorch version's Python Adam (Note [Adam as Python computes it]).
void adam_first_moment_(torch::Tensor& exp_avg, const torch::Tensor& grad, double beta1);

// sqrt(bias_correction2) as this version's Python Adam computes it.
double adam_bias_correction2_sqrt(double bias_correction2);

// Note [foreach as Python chooses it]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Python's SGD, Adam and AdamW have two paths that compute the same update:
// one operation per parameter (single-tensor) and one multi-tensor operation
// per step over all of a group's parameters (`foreach`). On the CPU the two
// give the same bits (a foreach operation there loops over the tensors). On
// a GPU they do not quite: a foreach kernel divides where the single-tensor
// kernel multiplies by a host divisor's reciprocal, and _foreach_norm sums a
// gradient in another order than linalg.vector_norm. Which one Python takes
// when the user says nothing (foreach=None) depends on the version:
//   - the optimizers: from 2.0 on, foreach when every parameter of the group
//     is on a GPU; 1.13 always single-tensor;
//   - clip_grad_norm_: from 2.0 on, foreach on the CPU and the GPU (the
//     norms by _foreach_norm, the scaling by _foreach_mul_); 1.13 one
//     torch.norm and one mul_ per gradient.
// lockstep takes the same default, so that an unchanged config agrees with
// the Python run of the same PyTorch on a GPU as it does on the CPU; the YAML
// key `foreach` (the optimizer's, and clip_grad's) chooses either way, as in
// Python. On a GPU the foreach path is also the fast one: a handful of
// launches a step instead of a dozen per parameter (BENCHMARKS.md, the H200).
// Where lockstep still differs from Python's default on a GPU:
//   - a capturable step (`capturable: true`, `cuda_graph`) is single-tensor,
//     where Python 2.x takes its multi-tensor capturable path;
//   - Adagrad and RMSprop (libtorch's own) step one tensor at a time, where
//     Python 2.x takes foreach;
//   - gradients of several dtypes or devices: lockstep takes the parts in
//     the order of their first tensor; Python 2.1+ takes them in the order
//     of a hash map (at::native::_group_tensors_by_first_tensors_device_and_dtype),
//     so the clip's total norm, a norm of the parts' norms stacked in that
//     order, can differ in the last bit. 1.13's foreach does not split by
//     dtype at all (a mixed list takes its per-tensor fallback).

// Whether Python's optimizers take their foreach path for a group of these
// parameters when foreach is not given.
bool optimizer_foreach_by_default(const std::vector<torch::Tensor>& params);

// Whether Python's clip_grad_norm_ takes its foreach path when foreach is not given.
bool clip_foreach_by_default();

// exp_avg <- beta1 * exp_avg + (1 - beta1) * grad for every pair, with the
// operations of this version's multi-tensor Adam (_foreach_mul_ and
// _foreach_add_ in 1.13, _foreach_lerp_ from 2.0 on).
void foreach_adam_first_moment_(at::TensorList exp_avgs, at::TensorList grads, double beta1);

// Every tensor of `tensors` multiplied in place by the 0-dim `factor` (on
// their device): one _foreach_mul_ where libtorch has the tensor overload
// (2.1 on), else one mul_ each, the same values.
void foreach_mul_(at::TensorList tensors, const torch::Tensor& factor);

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
