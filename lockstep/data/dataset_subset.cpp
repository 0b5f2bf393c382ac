#include "lockstep/data/dataset_subset.h"

#include <utility>

#include "lockstep/core/error.h"

namespace lockstep {

DatasetSubset::DatasetSubset(std::shared_ptr<Dataset> whole, std::vector<int64_t> indices)
    : whole_(std::move(whole)), indices_(std::move(indices)) {
  LOCKSTEP_CHECK(whole_ != nullptr, "DatasetSubset needs a dataset");
  LOCKSTEP_CHECK(!indices_.empty(), "DatasetSubset needs at least one index");
  const int64_t size = whole_->size();
  for (size_t i = 0; i < indices_.size(); ++i) {
    LOCKSTEP_CHECK(indices_[i] >= 0 && indices_[i] < size, "DatasetSubset: index ", indices_[i], " (entry ", i,
                   ") is outside the dataset's ", size, " examples");
  }
}

Batch DatasetSubset::get_batch(const std::vector<int64_t>& indices, uint64_t seed) const {
  std::vector<int64_t> whole_indices;
  whole_indices.reserve(indices.size());
  for (int64_t i : indices) {
    LOCKSTEP_CHECK(i >= 0 && i < size(), "DatasetSubset: example ", i, " asked of a subset of ", size());
    whole_indices.push_back(indices_[static_cast<size_t>(i)]);
  }
  return whole_->get_batch(whole_indices, seed);
}

std::shared_ptr<Dataset> subset_from_config(std::shared_ptr<Dataset> whole, const Config& indices) {
  if (indices.is_null()) return whole;
  const int64_t size = whole->size();
  std::vector<int64_t> chosen;
  if (indices.is_sequence()) {
    LOCKSTEP_CHECK(indices.size() > 0, indices.where(), ": indices is an empty list; give at least one index");
    for (size_t i = 0; i < indices.size(); ++i) {
      const int64_t index = indices.at(i).as<int64_t>();
      LOCKSTEP_CHECK(index >= 0 && index < size, indices.at(i).where(), ": index ", index,
                     " is outside the dataset's ", size, " examples");
      chosen.push_back(index);
    }
  } else {
    const int64_t count = indices.as<int64_t>();
    LOCKSTEP_CHECK(count >= 1, indices.where(), ": indices must be a positive count or a list of indices, got ",
                   count);
    LOCKSTEP_CHECK(count <= size, indices.where(), ": indices asks for the first ", count,
                   " examples of a dataset of ", size);
    for (int64_t i = 0; i < count; ++i) chosen.push_back(i);
  }
  return std::make_shared<DatasetSubset>(std::move(whole), std::move(chosen));
}

}  // namespace lockstep
