#include "lockstep/strategy/background_save.h"

#include <utility>

#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/core/logging.h"

namespace lockstep {

BackgroundSave::~BackgroundSave() {
  try {
    wait();
  } catch (...) {
    logger().error("A checkpoint save in the background failed: {}", describe_exception(std::current_exception()));
  }
}

void BackgroundSave::start(std::function<void()> save) {
  std::lock_guard<std::mutex> lock(mutex_);
  LOCKSTEP_ASSERT(!in_flight_ && !thread_.joinable(), "BackgroundSave: a save is in flight; wait() for it first");
  in_flight_ = true;
  error_ = nullptr;
  thread_ = std::thread([this, save = std::move(save)] {
    std::exception_ptr error;
    try {
      save();
    } catch (...) {
      error = std::current_exception();
    }
    // The queue empties under the lock, so an action queued meanwhile runs
    // here or, once in_flight_ is false, at once in after().
    for (;;) {
      std::vector<std::function<void()>> actions;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (error || queued_.empty()) {
          queued_.clear();
          error_ = error;
          in_flight_ = false;
          return;
        }
        actions.swap(queued_);
      }
      try {
        for (auto& action : actions) action();
      } catch (...) {
        error = std::current_exception();
      }
    }
  });
}

void BackgroundSave::wait() {
  std::thread finishing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finishing = std::move(thread_);
  }
  if (finishing.joinable()) finishing.join();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void BackgroundSave::after(std::function<void()> action) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_) {
      queued_.push_back(std::move(action));
      return;
    }
  }
  action();
}

}  // namespace lockstep
