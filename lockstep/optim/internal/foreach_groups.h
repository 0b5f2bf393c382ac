// Which parameters one multi-tensor (foreach) call of an optimizer step or
// a gradient clip takes (Note [foreach as Python chooses it],
// compat/internal/optim.h).
//
// Python 2.x splits a group's tensors by device and dtype before each
// foreach call (Optimizer._group_tensors_by_device_and_dtype), so that every
// call takes the multi-tensor kernel, whose arithmetic is not quite that of
// the per-tensor fallback on a GPU. These split the same way; the parts come
// in the order of their first tensor, where Python's come in a hash map's
// order (the one place that shows: the clip's norm over several parts, Note
// [foreach as Python chooses it]):
//
//   for (const std::vector<size_t>& part : lockstep::detail::by_device_and_dtype(params)) {
//     std::vector<torch::Tensor> some = lockstep::detail::pick(params, part);
//     at::_foreach_add_(some, lockstep::detail::pick(grads, part), -lr);
//   }
#pragma once

#include <cstddef>
#include <vector>

#include <torch/types.h>

namespace lockstep::detail {

// The indices of `tensors`, split by (device, dtype), each part in the
// tensors' order, the parts in the order their first tensor comes.
std::vector<std::vector<size_t>> by_device_and_dtype(const std::vector<torch::Tensor>& tensors);

// tensors[i] for each i of `indices`.
std::vector<torch::Tensor> pick(const std::vector<torch::Tensor>& tensors, const std::vector<size_t>& indices);

}  // namespace lockstep::detail
