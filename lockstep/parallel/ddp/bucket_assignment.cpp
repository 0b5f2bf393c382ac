#include "lockstep/parallel/ddp/bucket_assignment.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include "lockstep/core/error.h"

namespace lockstep {

std::vector<size_t> reverse_order(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.rbegin(), order.rend(), size_t{0});
  return order;
}

std::vector<std::vector<size_t>> assign_buckets(const std::vector<torch::Tensor>& params,
                                                const std::vector<size_t>& order,
                                                const std::vector<int64_t>& byte_limits) {
  LOCKSTEP_CHECK(!byte_limits.empty(), "assign_buckets needs at least one size limit");
  LOCKSTEP_CHECK(order.size() == params.size(), "assign_buckets: the order names ", order.size(),
                 " parameters but there are ", params.size());
  std::vector<bool> seen(params.size(), false);
  for (size_t index : order) {
    LOCKSTEP_CHECK(index < params.size() && !seen[index], "assign_buckets: the order is not a permutation");
    seen[index] = true;
  }

  struct Open {
    std::vector<size_t> indices;
    int64_t bytes = 0;
    size_t limit_index = 0;
  };
  // Keyed by dtype and device, in first-seen order for determinism.
  std::vector<std::pair<std::string, Open>> open;
  auto open_for = [&](const torch::Tensor& p) -> Open& {
    std::string key = std::string(c10::toString(p.scalar_type())) + "@" + p.device().str();
    for (auto& entry : open) {
      if (entry.first == key) return entry.second;
    }
    open.emplace_back(key, Open{});
    return open.back().second;
  };

  std::vector<size_t> position(params.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;

  std::vector<std::vector<size_t>> buckets;
  for (size_t index : order) {
    Open& bucket = open_for(params[index]);
    bucket.indices.push_back(index);
    bucket.bytes += params[index].numel() * static_cast<int64_t>(params[index].element_size());
    const int64_t limit = byte_limits[std::min(bucket.limit_index, byte_limits.size() - 1)];
    if (bucket.bytes >= limit) {
      buckets.push_back(std::move(bucket.indices));
      bucket.indices.clear();
      bucket.bytes = 0;
      bucket.limit_index += 1;
    }
  }
  for (auto& entry : open) {
    if (!entry.second.indices.empty()) buckets.push_back(std::move(entry.second.indices));
  }
  auto first_position = [&](const std::vector<size_t>& bucket) {
    size_t best = params.size();
    for (size_t index : bucket) best = std::min(best, position[index]);
    return best;
  };
  std::stable_sort(buckets.begin(), buckets.end(), [&](const auto& a, const auto& b) {
    return first_position(a) < first_position(b);
  });
  return buckets;
}

std::vector<std::vector<size_t>> initial_buckets(const std::vector<torch::Tensor>& params,
                                                 const std::vector<int64_t>& byte_limits, bool single_bucket) {
  std::vector<size_t> model_order(params.size());
  std::iota(model_order.begin(), model_order.end(), size_t{0});
  const std::vector<int64_t> limits =
      single_bucket ? std::vector<int64_t>{std::numeric_limits<int64_t>::max()} : byte_limits;
  auto buckets = assign_buckets(params, model_order, limits);
  std::reverse(buckets.begin(), buckets.end());
  return buckets;
}

}  // namespace lockstep
