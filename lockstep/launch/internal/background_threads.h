// Threads that work in the background for as long as their owner lives (a
// rendezvous's watcher, its lease keeper): each pauses between rounds of
// work on a stop signal its owner raises when it goes. A thread stuck in a
// call that does not return (to a server on a machine that is gone) is left
// to the end of the process rather than holding up the owner's destruction,
// so each thread holds what it uses itself (a shared_ptr), the signal too.
//
//   auto state = std::make_shared<State>();
//   BackgroundThreads threads;
//   threads.start([state, stop = threads.stop_signal()] {
//     while (stop->pause(std::chrono::milliseconds(200))) poll(*state);
//   });
//   // ~BackgroundThreads: raises the signal, waits up to a second, then leaves the stuck ones
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <c10/macros/Macros.h>

namespace lockstep {

class StopSignal {
 public:
  // Sleeps up to `period`; false once the signal is raised.
  bool pause(std::chrono::milliseconds period);
  bool raised() const;
  void raise();

 private:
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool raised_ = false;
};

class BackgroundThreads {
 public:
  explicit BackgroundThreads(std::chrono::milliseconds grace = std::chrono::seconds(1));
  ~BackgroundThreads();
  C10_DISABLE_COPY_AND_ASSIGN(BackgroundThreads);

  const std::shared_ptr<StopSignal>& stop_signal() const { return stop_; }
  void start(std::function<void()> body);
  // Raises the signal and waits for the threads (up to the grace period);
  // the destructor does it too.
  void stop();

 private:
  struct Running {
    std::mutex mutex;
    std::condition_variable ended;
    int count = 0;
  };
  std::chrono::milliseconds grace_;
  std::shared_ptr<StopSignal> stop_ = std::make_shared<StopSignal>();
  std::shared_ptr<Running> running_ = std::make_shared<Running>();
  std::vector<std::thread> threads_;
};

}  // namespace lockstep
