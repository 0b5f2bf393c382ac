// BatchPipeline: the worker machinery behind DataLoader (internal).
//
// Builds a numbered stream of batches with N threads and hands them out in
// stream order, whatever order the workers finish in. A TaskSource says what
// batch number k is (its indices and seed); it is called in order, one call at
// a time, so it may keep caches without locking. At most `capacity` batches
// are claimed ahead of the consumer, which bounds memory.
//
//   BatchPipeline pipeline(dataset, source, /*num_workers=*/2, /*capacity=*/4);
//   while (std::optional<Batch> batch = pipeline.next()) use(*batch);
//
// A failure while building batch k (in the source or the dataset) is carried
// to the consumer and thrown by the next() that would have returned batch k,
// on the consumer's thread, with the batch's position in the message; later
// batches are still delivered. Destruction stops the workers and joins them,
// whatever state they are in (a worker inside get_batch finishes that call).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "lockstep/data/dataset.h"

namespace lockstep::detail {

struct BatchTask {
  int64_t epoch = 0;           // where the batch sits in the stream, for messages;
  int64_t batch_in_epoch = 0;  // a source sets them before anything that can fail
  std::vector<int64_t> indices;
  uint64_t seed = 0;
};

class BatchPipeline {
 public:
  // Fills `task` with stream entry `sequence` (0, 1, 2, ... in order); false ends the stream.
  using TaskSource = std::function<bool(int64_t sequence, BatchTask& task)>;

  // num_workers == 0 builds each batch inside next(), on the caller's thread.
  // With pin_memory, whoever builds a batch also copies it to pinned memory.
  BatchPipeline(std::shared_ptr<const Dataset> dataset, TaskSource source, int num_workers, int capacity,
                bool pin_memory = false);
  ~BatchPipeline();
  BatchPipeline(const BatchPipeline&) = delete;
  BatchPipeline& operator=(const BatchPipeline&) = delete;

  // The next batch of the stream, or nullopt after its end.
  std::optional<Batch> next();

 private:
  struct Result {
    Batch batch;
    std::exception_ptr error;
    int64_t epoch = -1, batch_in_epoch = -1;  // -1: the source failed before naming a position
  };

  Result build(int64_t sequence, bool* has_task);  // runs the source; requires the lock (or no workers)
  void produce(const BatchTask& task, Result& result) const;
  void worker_loop();
  void stop_and_join();

  std::shared_ptr<const Dataset> dataset_;
  TaskSource source_;
  const int num_workers_;  // fixed before any worker starts (workers_ grows while they run)
  const int capacity_;
  const bool pin_memory_;

  std::mutex mutex_;
  std::condition_variable work_ready_;   // workers wait for room or stop
  std::condition_variable batch_ready_;  // the consumer waits for its batch
  int64_t next_claim_ = 0;               // the next sequence number a worker takes
  int64_t next_deliver_ = 0;             // the next sequence number next() returns
  int64_t end_ = -1;                     // the first sequence number past the stream, once known
  bool stop_ = false;
  std::map<int64_t, Result> done_;
  std::vector<std::thread> workers_;
};

}  // namespace lockstep::detail
