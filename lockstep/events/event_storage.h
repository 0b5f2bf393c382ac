// EventStorage: the metrics a training run produces, with their history.
//
// Hooks and the trainer put scalars in; writers (console, JSON lines,
// TensorBoard) read them out. Semantics follow detectron2's EventStorage:
// each scalar keeps a history of (value, iteration) pairs, and a smoothing
// hint says whether writers should show a windowed median or the latest value.
//
//   lockstep::EventStorage storage(/*start_iter=*/0);
//   storage.put_scalar("loss", 0.7);                  // smoothed by writers
//   storage.put_scalar("lr", 0.01, /*smoothing_hint=*/false);
//   {
//     auto scope = storage.name_scope("val");         // names become "val/..."
//     storage.put_scalar("accuracy", 0.91);
//   }
//   double median = storage.history("loss").median(20);
//   storage.step();                                    // next iteration
//
// Thread-safe: the trainer's asynchronous metric writer puts scalars from a
// background thread while hooks read on the main thread. A name scope belongs
// to the thread that opened it: the metric writer's scalars keep their names
// while an evaluation on the main thread puts "val/..." ones.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/types.h>

namespace lockstep {

// A series of (value, iteration) pairs with windowed statistics.
class HistoryBuffer {
 public:
  explicit HistoryBuffer(size_t max_length = 1000000) : max_length_(max_length) {}

  void update(double value, int64_t iteration);
  double latest() const;
  double median(size_t window) const;  // of the last `window` values
  double avg(size_t window) const;     // mean of the last `window` values, summed as numpy sums
  double min(size_t window) const;     // of the last `window` values
  double max(size_t window) const;     // of the last `window` values
  double global_avg() const;           // mean of every value ever added (also those dropped)
  size_t size() const { return data_.size(); }
  const std::vector<std::pair<double, int64_t>>& values() const { return data_; }

 private:
  std::vector<double> last(size_t window) const;  // the last `window` values (fewer if fewer)

  size_t max_length_;
  std::vector<std::pair<double, int64_t>> data_;
  double global_sum_ = 0;
  int64_t global_count_ = 0;
};

struct ScalarEvent {
  double value = 0;
  int64_t iteration = 0;
};

struct ImageEvent {
  std::string name;
  torch::Tensor image;  // CHW, uint8 or float in [0, 1]
  int64_t iteration = 0;
};

struct HistogramEvent {
  std::string name;
  torch::Tensor values;  // flattened copy on the CPU
  int64_t iteration = 0;
};

class EventStorage {
 public:
  explicit EventStorage(int64_t start_iter = 0) : iter_(start_iter) {}

  // `iteration` defaults to the current iteration.
  void put_scalar(const std::string& name, double value, bool smoothing_hint = true, int64_t iteration = -1);
  void put_scalars(const std::map<std::string, double>& values, bool smoothing_hint = true,
                   int64_t iteration = -1);
  void put_image(const std::string& name, const torch::Tensor& image);
  void put_histogram(const std::string& name, const torch::Tensor& values);

  bool has(const std::string& name) const;
  // A copy of the history of `name`; throws naming the known scalars if absent.
  HistoryBuffer history(const std::string& name) const;
  std::map<std::string, HistoryBuffer> histories() const;
  // The most recent value of every scalar.
  std::map<std::string, ScalarEvent> latest() const;
  // Like latest(), but scalars put with a smoothing hint report the median of
  // their last `window` values (detectron2's latest_with_smoothing_hint).
  std::map<std::string, ScalarEvent> latest_with_smoothing_hint(size_t window = 20) const;
  // Every scalar as `statistic` of its history (name, history, smoothing hint),
  // at the iteration of its latest value; the storage stays locked meanwhile.
  using ScalarStatistic = std::function<double(const std::string&, const HistoryBuffer&, bool)>;
  std::map<std::string, ScalarEvent> latest_with(const ScalarStatistic& statistic) const;
  bool smoothing_hint(const std::string& name) const;

  // Images and histograms since the last clear (writers consume them).
  std::vector<ImageEvent> images() const;
  std::vector<HistogramEvent> histograms() const;
  void clear_images();
  void clear_histograms();

  int64_t iter() const;
  void set_iter(int64_t iteration);
  void step() { set_iter(iter() + 1); }

  // Prefixes names put by this thread while the returned guard lives with "<name>/".
  class NameScope {
   public:
    NameScope(EventStorage* storage, std::string previous) : storage_(storage), previous_(std::move(previous)) {}
    NameScope(NameScope&& other) noexcept : storage_(other.storage_), previous_(std::move(other.previous_)) {
      other.storage_ = nullptr;
    }
    C10_DISABLE_COPY_AND_ASSIGN(NameScope);
    ~NameScope();

   private:
    EventStorage* storage_;
    std::string previous_;
  };
  [[nodiscard]] NameScope name_scope(const std::string& name);

 private:
  // The calling thread's prefix; call with mutex_ held.
  std::string prefix_locked() const;

  mutable std::mutex mutex_;
  int64_t iter_;
  std::map<std::thread::id, std::string> prefixes_;  // by the thread that opened the scopes
  std::map<std::string, HistoryBuffer> history_;
  std::map<std::string, ScalarEvent> latest_;
  std::map<std::string, bool> smoothing_hints_;
  std::vector<ImageEvent> images_;
  std::vector<HistogramEvent> histograms_;
};

}  // namespace lockstep
