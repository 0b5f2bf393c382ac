#include "lockstep/events/event_storage.h"

#include <algorithm>
#include <numeric>

#include "lockstep/core/error.h"
#include "lockstep/core/spelling.h"

namespace lockstep {

void HistoryBuffer::update(double value, int64_t iteration) {
  if (data_.size() == max_length_) data_.erase(data_.begin());
  data_.emplace_back(value, iteration);
  global_sum_ += value;
  global_count_ += 1;
}

double HistoryBuffer::latest() const {
  LOCKSTEP_CHECK(!data_.empty(), "HistoryBuffer::latest on an empty history");
  return data_.back().first;
}

double HistoryBuffer::median(size_t window) const {
  LOCKSTEP_CHECK(!data_.empty(), "HistoryBuffer::median on an empty history");
  std::vector<double> tail = last(window);
  // numpy.median semantics: the mean of the two middle values for an even count.
  std::sort(tail.begin(), tail.end());
  const size_t mid = tail.size() / 2;
  return tail.size() % 2 == 1 ? tail[mid] : (tail[mid - 1] + tail[mid]) / 2.0;
}

// Note [numpy's pairwise sum]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Both libraries lockstep logs like average with numpy: mmengine's
// HistoryBuffer.mean is `logs[-window:].sum() / counts[-window:].sum()`,
// detectron2's avg is `np.mean(...)`. numpy does not add left to right: from
// 8 values on it keeps eight running sums, adds them pairwise, then the rest
// in order, and splits runs longer than 128 in two (pairwise_sum in numpy's
// loops_utils). A left-to-right sum of 10 losses differs from it in the last
// bit often enough that mmengine's scalars.json would not be matched (numpy
// 1.24 agrees with numpy_sum on 20,000 random runs of 1 to 300 values).
namespace {
double numpy_sum(const double* values, size_t count) {
  constexpr size_t kBlock = 128;
  if (count < 8) {
    double sum = 0.;
    for (size_t i = 0; i < count; ++i) sum += values[i];
    return sum;
  }
  if (count <= kBlock) {
    double partial[8];
    for (size_t j = 0; j < 8; ++j) partial[j] = values[j];
    size_t i = 8;
    for (; i < count - count % 8; i += 8) {
      for (size_t j = 0; j < 8; ++j) partial[j] += values[i + j];
    }
    double sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                 ((partial[4] + partial[5]) + (partial[6] + partial[7]));
    for (; i < count; ++i) sum += values[i];
    return sum;
  }
  size_t half = count / 2;
  half -= half % 8;
  return numpy_sum(values, half) + numpy_sum(values + half, count - half);
}
}  // namespace

std::vector<double> HistoryBuffer::last(size_t window) const {
  const size_t count = std::min(window, data_.size());
  std::vector<double> tail;
  tail.reserve(count);
  for (size_t i = data_.size() - count; i < data_.size(); ++i) tail.push_back(data_[i].first);
  return tail;
}

double HistoryBuffer::avg(size_t window) const {
  LOCKSTEP_CHECK(!data_.empty(), "HistoryBuffer::avg on an empty history");
  const std::vector<double> tail = last(window);
  return numpy_sum(tail.data(), tail.size()) / static_cast<double>(tail.size());
}

double HistoryBuffer::min(size_t window) const {
  LOCKSTEP_CHECK(!data_.empty(), "HistoryBuffer::min on an empty history");
  const std::vector<double> tail = last(window);
  return *std::min_element(tail.begin(), tail.end());
}

double HistoryBuffer::max(size_t window) const {
  LOCKSTEP_CHECK(!data_.empty(), "HistoryBuffer::max on an empty history");
  const std::vector<double> tail = last(window);
  return *std::max_element(tail.begin(), tail.end());
}

double HistoryBuffer::global_avg() const {
  LOCKSTEP_CHECK(global_count_ > 0, "HistoryBuffer::global_avg on an empty history");
  return global_sum_ / static_cast<double>(global_count_);
}

void EventStorage::put_scalar(const std::string& name, double value, bool smoothing_hint, int64_t iteration) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string full_name = prefix_locked() + name;
  const int64_t at = iteration < 0 ? iter_ : iteration;
  history_[full_name].update(value, at);
  latest_[full_name] = ScalarEvent{value, at};
  auto existing = smoothing_hints_.find(full_name);
  if (existing == smoothing_hints_.end()) {
    smoothing_hints_[full_name] = smoothing_hint;
  } else {
    LOCKSTEP_CHECK(existing->second == smoothing_hint, "scalar '", full_name,
                   "' was put with a different smoothing hint before");
  }
}

void EventStorage::put_scalars(const std::map<std::string, double>& values, bool smoothing_hint,
                               int64_t iteration) {
  for (const auto& entry : values) put_scalar(entry.first, entry.second, smoothing_hint, iteration);
}

void EventStorage::put_image(const std::string& name, const torch::Tensor& image) {
  std::lock_guard<std::mutex> lock(mutex_);
  images_.push_back(ImageEvent{prefix_locked() + name, image.detach().cpu(), iter_});
}

void EventStorage::put_histogram(const std::string& name, const torch::Tensor& values) {
  std::lock_guard<std::mutex> lock(mutex_);
  histograms_.push_back(
      HistogramEvent{prefix_locked() + name, values.detach().to(torch::kCPU, torch::kDouble).flatten().clone(), iter_});
}

bool EventStorage::has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return history_.count(name) > 0;
}

HistoryBuffer EventStorage::history(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = history_.find(name);
  if (found == history_.end()) {
    const std::string known = known_names(history_);
    LOCKSTEP_FAIL("no scalar named '", name, "' in the event storage; it holds: ", known.empty() ? "(none)" : known);
  }
  return found->second;
}

std::map<std::string, HistoryBuffer> EventStorage::histories() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return history_;
}

std::map<std::string, ScalarEvent> EventStorage::latest() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return latest_;
}

std::map<std::string, ScalarEvent> EventStorage::latest_with_smoothing_hint(size_t window) const {
  return latest_with([window](const std::string& /*name*/, const HistoryBuffer& history, bool smoothing_hint) {
    return smoothing_hint ? history.median(window) : history.latest();
  });
}

std::map<std::string, ScalarEvent> EventStorage::latest_with(const ScalarStatistic& statistic) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, ScalarEvent> result;
  for (const auto& [name, event] : latest_) {
    result[name] = ScalarEvent{statistic(name, history_.at(name), smoothing_hints_.at(name)), event.iteration};
  }
  return result;
}

bool EventStorage::smoothing_hint(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = smoothing_hints_.find(name);
  return found != smoothing_hints_.end() && found->second;
}

std::vector<ImageEvent> EventStorage::images() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return images_;
}

std::vector<HistogramEvent> EventStorage::histograms() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return histograms_;
}

void EventStorage::clear_images() {
  std::lock_guard<std::mutex> lock(mutex_);
  images_.clear();
}

void EventStorage::clear_histograms() {
  std::lock_guard<std::mutex> lock(mutex_);
  histograms_.clear();
}

int64_t EventStorage::iter() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return iter_;
}

void EventStorage::set_iter(int64_t iteration) {
  std::lock_guard<std::mutex> lock(mutex_);
  iter_ = iteration;
}

std::string EventStorage::prefix_locked() const {
  auto found = prefixes_.find(std::this_thread::get_id());
  return found == prefixes_.end() ? std::string() : found->second;
}

EventStorage::NameScope EventStorage::name_scope(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string previous = prefix_locked();
  prefixes_[std::this_thread::get_id()] = previous + name + "/";
  return NameScope(this, previous);
}

// Runs on the thread that opened the scope (a guard is not handed across threads).
EventStorage::NameScope::~NameScope() {
  if (storage_ == nullptr) return;
  std::lock_guard<std::mutex> lock(storage_->mutex_);
  if (previous_.empty()) {
    storage_->prefixes_.erase(std::this_thread::get_id());
  } else {
    storage_->prefixes_[std::this_thread::get_id()] = previous_;
  }
}

}  // namespace lockstep
