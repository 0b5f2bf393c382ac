// How DDP groups gradients into communication buckets.
//
// Parameters are taken in the order their gradients are expected to become
// ready (at first the reverse of the model's order; after one iteration, the
// order observed). Each dtype/device pair fills its own bucket until it holds
// at least the current size limit; the first limit is small (1 MiB) so that
// communication starts early, later ones large (25 MiB) so that few
// collectives carry most bytes. Buckets are then ordered by the earliest
// position they contain, so bucket i becomes ready before bucket i+1.
// Why the order matters, and when buckets are rebuilt: see
// Note [Bucket order and rebuild] in reducer_buckets.cpp.
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

// The buckets of DDP's first iteration, exactly as PyTorch's
// DistributedDataParallel builds them (so that a 4-rank run sums in the same
// order as PyTorch's and stays bitwise equal to it): with `single_bucket`
// (no find_unused_parameters, or static_graph) one bucket holding every
// parameter in model order, reduced once the whole backward is done -- the
// real gradient order is unknown until then, and buckets are rebuilt in the
// observed order after the first iteration; otherwise the model order cut at
// the size limits, the buckets listed last-first (the last layers' gradients
// come first) and each keeping model order inside. See Note [Bucket order and rebuild].
std::vector<std::vector<size_t>> initial_buckets(const std::vector<torch::Tensor>& params,
                                                 const std::vector<int64_t>& byte_limits, bool single_bucket);

}  // namespace lockstep
