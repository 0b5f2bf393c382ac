#include "lockstep/data/batch_pipeline.h"

#include "lockstep/core/error.h"

namespace lockstep::detail {

BatchPipeline::BatchPipeline(std::shared_ptr<const Dataset> dataset, TaskSource source, int num_workers,
                             int capacity, bool pin_memory)
    : dataset_(std::move(dataset)),
      source_(std::move(source)),
      num_workers_(std::max(num_workers, 0)),
      capacity_(std::max(capacity, 1)),
      pin_memory_(pin_memory) {
  LOCKSTEP_CHECK(num_workers >= 0, "data loader: num_workers must be non-negative, got ", num_workers);
  workers_.reserve(num_workers);
  try {
    for (int i = 0; i < num_workers; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (...) {
    stop_and_join();  // the ones that started
    throw;
  }
}

BatchPipeline::~BatchPipeline() { stop_and_join(); }

void BatchPipeline::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

BatchPipeline::Result BatchPipeline::build(int64_t sequence, bool* has_task) {
  Result result;
  BatchTask task;
  task.epoch = task.batch_in_epoch = -1;
  try {
    *has_task = source_(sequence, task);
  } catch (...) {
    *has_task = true;
    result.error = std::current_exception();
  }
  result.epoch = task.epoch;
  result.batch_in_epoch = task.batch_in_epoch;
  if (result.error) return result;
  if (*has_task && num_workers_ == 0) produce(task, result);
  if (*has_task && num_workers_ > 0) {
    // Leave the lock while the dataset works: that is what workers are for.
    mutex_.unlock();
    produce(task, result);
    mutex_.lock();
  }
  return result;
}

void BatchPipeline::produce(const BatchTask& task, Result& result) const {
  try {
    result.batch = dataset_->get_batch(task.indices, task.seed);
    // Fewer rows are examples a dataset skipped as unreadable; more is a bug.
    LOCKSTEP_CHECK(result.batch.size() <= static_cast<int64_t>(task.indices.size()),
                   "the dataset returned a batch of ", result.batch.size(), " examples for ",
                   task.indices.size(), " indices");
    if (pin_memory_) result.batch = result.batch.pin_memory();
  } catch (...) {
    result.error = std::current_exception();
  }
}

void BatchPipeline::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_ready_.wait(lock, [&] { return stop_ || (end_ < 0 && next_claim_ < next_deliver_ + capacity_); });
    if (stop_) return;
    const int64_t sequence = next_claim_++;
    bool has_task = false;
    Result result = build(sequence, &has_task);  // unlocks while the dataset works
    if (!has_task) {
      end_ = end_ < 0 ? sequence : std::min(end_, sequence);
    } else {
      done_.emplace(sequence, std::move(result));
    }
    batch_ready_.notify_all();
  }
}

std::optional<Batch> BatchPipeline::next() {
  Result result;
  if (num_workers_ == 0) {
    if (end_ >= 0) return std::nullopt;
    bool has_task = false;
    result = build(next_deliver_, &has_task);
    if (!has_task) {
      end_ = next_deliver_;
      return std::nullopt;
    }
    ++next_deliver_;
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    batch_ready_.wait(lock, [&] { return done_.count(next_deliver_) > 0 || (end_ >= 0 && next_deliver_ >= end_); });
    auto found = done_.find(next_deliver_);
    if (found == done_.end()) return std::nullopt;
    result = std::move(found->second);
    done_.erase(found);
    ++next_deliver_;
    lock.unlock();
    work_ready_.notify_all();
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
