#include "lockstep/launch/internal/background_threads.h"

namespace lockstep {

bool StopSignal::pause(std::chrono::milliseconds period) {
  std::unique_lock<std::mutex> lock(mutex_);
  return !wake_.wait_for(lock, period, [&] { return raised_; });
}

bool StopSignal::raised() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return raised_;
}

void StopSignal::raise() {
  std::lock_guard<std::mutex> lock(mutex_);
  raised_ = true;
  wake_.notify_all();
}

BackgroundThreads::BackgroundThreads(std::chrono::milliseconds grace) : grace_(grace) {}

void BackgroundThreads::start(std::function<void()> body) {
  {
    std::lock_guard<std::mutex> lock(running_->mutex);
    ++running_->count;
  }
  threads_.emplace_back([running = running_, body = std::move(body)] {
    body();
    std::lock_guard<std::mutex> lock(running->mutex);
    --running->count;
    running->ended.notify_all();
  });
}

BackgroundThreads::~BackgroundThreads() { stop(); }

void BackgroundThreads::stop() {
  stop_->raise();
  std::unique_lock<std::mutex> lock(running_->mutex);
  const bool all_ended = running_->ended.wait_for(lock, grace_, [&] { return running_->count == 0; });
  lock.unlock();
  for (auto& thread : threads_) {
    if (all_ended) {
      thread.join();
    } else {
      thread.detach();
    }
  }
  threads_.clear();
}

}  // namespace lockstep
