#include "lockstep/core/ordered_worker.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <utility>

#include "lockstep/core/durations.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"

namespace lockstep {
OrderedWorker::OrderedWorker(std::string name, int capacity, double wait_limit_s)
    : name_(std::move(name)), capacity_(capacity), wait_limit_s_(wait_limit_s) {
  LOCKSTEP_CHECK(capacity_ >= 1, name_, ": the queue's capacity must be at least 1, got ", capacity_);
  LOCKSTEP_CHECK(wait_limit_s_ >= 0, name_, ": the wait limit must be >= 0 seconds (0 waits without limit), got ",
                 wait_limit_s_);
  thread_ = std::thread([this] { loop(); });
}

OrderedWorker::~OrderedWorker() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    dropped.swap(tasks_);
  }
  wake_.notify_all();
  room_.notify_all();
  if (!dropped.empty()) {
    logger().warn("{}: dropping {} task(s) that had not started", name_, dropped.size());
  }
  dropped.clear();  // outside the lock: a task's captures may take a while to destroy
  thread_.join();
}

void OrderedWorker::submit(std::function<void()> task) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto has_room = [this] { return static_cast<int64_t>(tasks_.size()) < capacity_; };
    if (wait_limit_s_ > 0) {
      if (!room_.wait_for(lock, wait_duration(wait_limit_s_), has_room)) {
        LOCKSTEP_FAIL(name_, ": waited ", seconds_text(wait_limit_s_), " s to queue a task: ", describe(),
                      " (is the running task stuck, e.g. a collective waiting for a rank that stopped?)");
      }
    } else {
      room_.wait(lock, has_room);
    }
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void OrderedWorker::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto idle = [this] { return tasks_.empty() && !busy_; };
  if (wait_limit_s_ > 0) {
    if (!room_.wait_for(lock, wait_duration(wait_limit_s_), idle)) {
      LOCKSTEP_FAIL(name_, ": waited ", seconds_text(wait_limit_s_), " s for its tasks to finish: ",
                    describe(), " (is the running task stuck, e.g. a collective waiting for a rank that stopped?)");
    }
  } else {
    room_.wait(lock, idle);
  }
}

void OrderedWorker::rethrow_error() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

int64_t OrderedWorker::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(tasks_.size());
}

std::string OrderedWorker::describe() const {
  const std::string waiting = str_cat(tasks_.size(), tasks_.size() == 1 ? " task is" : " tasks are", " queued");
  if (!busy_) return waiting + " and none is running";
  const double running = std::chrono::duration<double>(std::chrono::steady_clock::now() - running_since_).count();
  return str_cat(waiting, " and the running one has been running for ", seconds_text(running), " s");
}

void OrderedWorker::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (stopping_) return;  // the destructor dropped what was left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
    running_since_ = std::chrono::steady_clock::now();
    lock.unlock();
    room_.notify_all();  // a submit() may be waiting for the slot just freed
    try {
      task();
    } catch (...) {
      std::lock_guard<std::mutex> error_lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    task = nullptr;  // its captures go before drain() returns
    lock.lock();
    busy_ = false;
    if (tasks_.empty()) room_.notify_all();
  }
}

}  // namespace lockstep
