// BatchPipeline: the worker machinery behind DataLoader (internal).
//
// Builds a numbered stream of batches with N threads and hands them out in
// stream order, whatever order the workers finish in. A TaskSource says what
// batch number k is (its indices and seed); it is called in order, one call at
// a time, so it may keep caches without locking. At most `capacity` batches
// are claimed ahead of the consumer, which bounds memory.
//
//   BatchPipeline pipeline(dataset, source, /*num_workers=*/2, /*capacity=*/4,
//                          /*pin_memory=*/false, /*timeout_s=*/1800);
//   while (std::optional<Batch> batch = pipeline.next()) use(*batch);
//
// A failure while building batch k (in the source or the dataset) is carried
// to the consumer and thrown by the next() that would have returned batch k,
// on the consumer's thread, with the batch's position in the message; later
// batches are still delivered.
//
// Waits are bounded by `timeout_s` (0: no bound). next() waits at most that
// long for its batch, then throws lockstep::Error naming the batch and the
// worker building it, and skips that batch (a later next() goes on with
// batch k + 1; the stuck worker's result, should it ever come, is dropped).
// Destruction stops the workers: a worker inside get_batch is given up to
// `timeout_s` to return (none once a next() has timed out) and joined; one that
// is still inside get_batch after that is detached, not joined, so that a hung
// dataset cannot keep the process from exiting (Note [Stuck loader workers] in
// the .cpp). With num_workers 0 the batch is built on the caller's thread and
// nothing is bounded. The source runs under the pipeline's lock and is not
// bounded either: it is lockstep's index arithmetic plus the sampler's
// epoch_indices, computed once per epoch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <c10/macros/Macros.h>

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
  // timeout_s: see the header comment; 0 waits without limit.
  BatchPipeline(std::shared_ptr<const Dataset> dataset, TaskSource source, int num_workers, int capacity,
                bool pin_memory = false, double timeout_s = 0);
  ~BatchPipeline();
  C10_DISABLE_COPY_AND_ASSIGN(BatchPipeline);

  // The next batch of the stream, or nullopt after its end. Throws when the
  // batch failed, or when it is not ready within timeout_s.
  std::optional<Batch> next();

 private:
  // Everything the workers touch. It lives on the heap, shared by the
  // pipeline and each worker thread, so that it outlives a detached worker.
  struct Shared;

  void stop_and_join();

  std::shared_ptr<Shared> shared_;
  std::vector<std::thread> workers_;
  bool timed_out_ = false;  // a next() gave up on a batch: the destructor waits for no worker
};

}  // namespace lockstep::detail
