#include "lockstep/data/internal/batch_pipeline.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "lockstep/core/durations.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"

namespace lockstep::detail {

// Note [Stuck loader workers]
// A worker can get stuck inside the dataset's get_batch for good: a read from
// a hung network file system, a deadlock in user code. A thread stuck like
// that cannot be interrupted, and joining it never returns, so before this
// note a hung dataset hung the trainer in next() and then, had next() given
// up, again in the destructor, and the process could not even exit.
//
// So next() waits at most `timeout_s` for its batch, and the destructor joins
// only the workers that are not inside get_batch; a worker still inside it
// (after a timeout at once, otherwise after waiting up to timeout_s for it)
// is detached and left behind. For that to be safe, nothing a worker touches
// may belong to the pipeline object: the mutex, the condition variables, the
// queue of finished batches, the source and the dataset all live in a heap
// `Shared` that each worker thread co-owns through a std::shared_ptr. When a
// left-behind worker's get_batch returns at last, it takes the lock of that
// still-valid state, sees `stop`, drops its batch and exits, releasing the
// last reference: the state (and the dataset, if no one else holds it) is
// freed then, on that thread.
//
// The alternatives were worse: joining waits forever; std::thread has no way
// to cancel, and pthread_cancel inside libtorch or user code leaks locks;
// running get_batch in a subprocess (PyTorch's way) costs a copy of every batch
// and gives up what threads are for here. The cost of detaching is that a
// left-behind thread may still be running when the process exits; that is
// what a hung read does to any process, and it is logged.

struct BatchPipeline::Shared {
  struct Result {
    Batch batch;
    std::exception_ptr error;
    int64_t epoch = -1, batch_in_epoch = -1;  // -1: the source failed before naming a position
  };
  // What a worker is doing, for the timeout's message and the destructor.
  struct WorkerState {
    int64_t sequence = -1;  // the stream entry it is building; -1: none
    int64_t epoch = -1, batch_in_epoch = -1;
    std::chrono::steady_clock::time_point since;
  };

  Shared(std::shared_ptr<const Dataset> dataset, TaskSource source, int num_workers, int capacity, bool pin_memory,
         double timeout_s)
      : dataset(std::move(dataset)),
        source(std::move(source)),
        num_workers(num_workers),
        capacity(capacity),
        pin_memory(pin_memory),
        timeout_s(timeout_s),
        workers(static_cast<size_t>(num_workers)) {}

  Result build(int64_t sequence, bool* has_task, int worker);  // requires the lock (or no workers)
  void produce(const BatchTask& task, Result& result) const;
  void worker_loop(int index);
  bool any_busy() const {
    return std::any_of(workers.begin(), workers.end(), [](const WorkerState& w) { return w.sequence >= 0; });
  }
  std::string describe_wait(double waited) const;  // what next() waits for; requires the lock

  const std::shared_ptr<const Dataset> dataset;
  const TaskSource source;
  const int num_workers;
  const int capacity;
  const bool pin_memory;
  const double timeout_s;

  std::mutex mutex;
  std::condition_variable work_ready;   // workers wait for room or stop
  std::condition_variable batch_ready;  // the consumer waits for its batch, the destructor for busy workers
  int64_t next_claim = 0;               // the next sequence number a worker takes
  int64_t next_deliver = 0;             // the next sequence number next() returns
  int64_t end = -1;                     // the first sequence number past the stream, once known
  bool stop = false;
  std::map<int64_t, Result> done;
  std::vector<WorkerState> workers;  // by worker index; sized once, before any worker starts
};

BatchPipeline::BatchPipeline(std::shared_ptr<const Dataset> dataset, TaskSource source, int num_workers,
                             int capacity, bool pin_memory, double timeout_s) {
  LOCKSTEP_CHECK(num_workers >= 0, "data loader: num_workers must be non-negative, got ", num_workers);
  LOCKSTEP_CHECK(timeout_s >= 0, "data loader: timeout must be >= 0 seconds (0 waits without limit), got ",
                 timeout_s);
  shared_ = std::make_shared<Shared>(std::move(dataset), std::move(source), num_workers, std::max(capacity, 1),
                                     pin_memory, timeout_s);
  workers_.reserve(num_workers);
  try {
    for (int i = 0; i < num_workers; ++i) {
      // Each thread co-owns the state: see Note [Stuck loader workers].
      workers_.emplace_back([shared = shared_, i] { shared->worker_loop(i); });
    }
  } catch (...) {
    stop_and_join();  // the ones that started
    throw;
  }
}

BatchPipeline::~BatchPipeline() { stop_and_join(); }

// Joins the workers that are not inside get_batch and detaches the others,
// after waiting for them up to the timeout (not at all after a timeout).
// See Note [Stuck loader workers].
void BatchPipeline::stop_and_join() {
  Shared& shared = *shared_;
  std::vector<bool> left_behind(workers_.size(), false);
  {
    std::unique_lock<std::mutex> lock(shared.mutex);
    shared.stop = true;
    shared.work_ready.notify_all();
    auto idle = [&] { return !shared.any_busy(); };
    if (!timed_out_) {
      if (shared.timeout_s > 0) {
        shared.batch_ready.wait_for(lock, wait_duration(shared.timeout_s), idle);
      } else {
        shared.batch_ready.wait(lock, idle);
      }
    }
    for (size_t i = 0; i < workers_.size(); ++i) {
      const Shared::WorkerState& state = shared.workers[i];
      if (state.sequence < 0) continue;
      left_behind[i] = true;
      logger().warn(
          "data loader: leaving worker {} behind (detached, not joined): it has been building epoch {}, batch {} "
          "for {} s and the dataset's get_batch has not returned",
          i, state.epoch, state.batch_in_epoch, seconds_text(seconds_since(state.since)));
    }
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (!workers_[i].joinable()) continue;
    if (left_behind[i]) {
      workers_[i].detach();
    } else {
      workers_[i].join();
    }
  }
}

BatchPipeline::Shared::Result BatchPipeline::Shared::build(int64_t sequence, bool* has_task, int worker) {
  Result result;
  BatchTask task;
  task.epoch = task.batch_in_epoch = -1;
  try {
    *has_task = source(sequence, task);
  } catch (...) {
    *has_task = true;
    result.error = std::current_exception();
  }
  result.epoch = task.epoch;
  result.batch_in_epoch = task.batch_in_epoch;
  if (result.error) return result;
  if (*has_task && num_workers == 0) produce(task, result);
  if (*has_task && num_workers > 0) {
    WorkerState& state = workers[static_cast<size_t>(worker)];
    state.epoch = task.epoch;
    state.batch_in_epoch = task.batch_in_epoch;
    // Leave the lock while the dataset works: that is what workers are for.
    mutex.unlock();
    produce(task, result);
    mutex.lock();
  }
  return result;
}

void BatchPipeline::Shared::produce(const BatchTask& task, Result& result) const {
  try {
    result.batch = dataset->get_batch(task.indices, task.seed);
    // Fewer rows are examples a dataset skipped as unreadable; more is a bug.
    LOCKSTEP_CHECK(result.batch.size() <= static_cast<int64_t>(task.indices.size()),
                   "the dataset returned a batch of ", result.batch.size(), " examples for ",
                   task.indices.size(), " indices");
    if (pin_memory) result.batch = result.batch.pin_memory();
  } catch (...) {
    result.error = std::current_exception();
  }
}

void BatchPipeline::Shared::worker_loop(int index) {
  WorkerState& state = workers[static_cast<size_t>(index)];
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    work_ready.wait(lock, [&] { return stop || (end < 0 && next_claim < next_deliver + capacity); });
    if (stop) return;
    const int64_t sequence = next_claim++;
    state = WorkerState{sequence, -1, -1, std::chrono::steady_clock::now()};
    bool has_task = false;
    Result result = build(sequence, &has_task, index);  // unlocks while the dataset works
    state = WorkerState{};
    if (!has_task) {
      end = end < 0 ? sequence : std::min(end, sequence);
    } else if (sequence >= next_deliver) {  // else next() timed out on it and moved on
      done.emplace(sequence, std::move(result));
    }
    batch_ready.notify_all();
  }
}

std::string BatchPipeline::Shared::describe_wait(double waited) const {
  std::string builders;  // what the busy workers are building, when none builds the awaited batch
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerState& state = workers[i];
    if (state.sequence < 0) continue;
    if (state.sequence == next_deliver) {
      return str_cat("data loader: waited ", seconds_text(waited), " s for epoch ", state.epoch, ", batch ",
                     state.batch_in_epoch, ": worker ", i, " has been building it for ",
                     seconds_text(seconds_since(state.since)), " s (the dataset's get_batch has not returned)");
    }
    builders += str_cat(builders.empty() ? "" : "; ", "worker ", i, " has been building epoch ", state.epoch,
                        ", batch ", state.batch_in_epoch, " for ", seconds_text(seconds_since(state.since)),
                        " s");
  }
  return str_cat("data loader: waited ", seconds_text(waited), " s for the next batch, which no worker has started: ",
                 builders.empty() ? "no worker is busy either" : builders + " (the dataset's get_batch has not returned)");
}

std::optional<Batch> BatchPipeline::next() {
  Shared& shared = *shared_;
  Shared::Result result;
  if (shared.num_workers == 0) {
    if (shared.end >= 0) return std::nullopt;
    bool has_task = false;
    result = shared.build(shared.next_deliver, &has_task, -1);
    if (!has_task) {
      shared.end = shared.next_deliver;
      return std::nullopt;
    }
    ++shared.next_deliver;
  } else {
    std::unique_lock<std::mutex> lock(shared.mutex);
    auto ready = [&] {
      return shared.done.count(shared.next_deliver) > 0 || (shared.end >= 0 && shared.next_deliver >= shared.end);
    };
    if (shared.timeout_s > 0) {
      if (!shared.batch_ready.wait_for(lock, wait_duration(shared.timeout_s), ready)) {
        std::string message = str_cat(shared.describe_wait(shared.timeout_s),
                                      "; a slower dataset needs a larger timeout (the data loader's `timeout` key, "
                                      "e.g. train_dataloader.timeout; 0 waits without limit)");
        // Skip the batch, as a failed one is skipped: the stream goes on after
        // it. Unclaimed, it is never built; claimed, its result is dropped.
        ++shared.next_deliver;
        shared.next_claim = std::max(shared.next_claim, shared.next_deliver);
        timed_out_ = true;
        lock.unlock();
        shared.work_ready.notify_all();
        LOCKSTEP_FAIL(message);
      }
    } else {
      shared.batch_ready.wait(lock, ready);
    }
    auto found = shared.done.find(shared.next_deliver);
    if (found == shared.done.end()) return std::nullopt;
    result = std::move(found->second);
    shared.done.erase(found);
    ++shared.next_deliver;
    lock.unlock();
    shared.work_ready.notify_all();
  }
  if (result.error) {
    try {
      std::rethrow_exception(result.error);
    } catch (...) {
      if (result.epoch < 0) rethrow_with_context("data loader: while choosing the indices of a batch");
      rethrow_with_context(str_cat("data loader: epoch ", result.epoch, ", batch ", result.batch_in_epoch));
    }
  }
  return std::move(result.batch);
}

}  // namespace lockstep::detail
