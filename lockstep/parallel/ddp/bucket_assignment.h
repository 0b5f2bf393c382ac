// How DDP groups gradients into communication buckets.
//
// Parameters are taken in the order their gradients are expected to become
// ready (at first the reverse of the model's order; after one iteration, the
// order observed). Each dtype/device pair fills its own bucket until it holds
// at least the current size limit; the first limit is small (1 MiB) so that
// communication starts early, later ones large (25 MiB) so that few
// collectives carry most bytes. Buckets are then ordered by the earliest
// position they contain, so bucket i becomes ready before bucket i+1.
//
//   auto buckets = lockstep::assign_buckets(params, lockstep::reverse_order(params.size()),
//                                           {1 << 20, 25 << 20});
//   // buckets[0] holds the indices of the last layers' parameters
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace lockstep {

// `order`: indices into params, each exactly once. `byte_limits`: the limit of
// the first bucket of each dtype/device, then of the next, ...; the last
// value repeats.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<torch::Tensor>& params,
                                                const std::vector<size_t>& order,
                                                const std::vector<int64_t>& byte_limits);

// {n-1, n-2, ..., 0}
std::vector<size_t> reverse_order(size_t n);

}  // namespace lockstep
