// One checkpoint save running on a thread of its own while training goes on
// (FSDPStrategy's async_save, as torch.distributed.checkpoint.async_save):
// at most one at a time, its error kept for whoever waits, and actions that
// must follow it (removing the checkpoints it replaces) queued until it has
// succeeded.
//
//   lockstep::BackgroundSave saver;
//   saver.wait();                                   // the previous save: throws its error
//   saver.start([staged] { write(staged); });        // returns at once
//   saver.after([old] { remove_checkpoint(old); });  // once the save in flight is whole; now if none is
//   saver.wait();                                   // before the process ends
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <c10/macros/Macros.h>

namespace lockstep {

class BackgroundSave {
 public:
  BackgroundSave() = default;
  ~BackgroundSave();  // waits for the save in flight (its error is logged, not thrown)
  C10_DISABLE_COPY_AND_ASSIGN(BackgroundSave);

  // Runs `save` on a new thread; a save must not be in flight (wait() first).
  void start(std::function<void()> save);
  // Waits for the save in flight, if any; rethrows what it threw.
  void wait();
  // Runs `action` once the save in flight has succeeded (on its thread), or
  // now when none is in flight. A failed save drops its queued actions.
  void after(std::function<void()> action);

 private:
  std::mutex mutex_;
  std::thread thread_;
  bool in_flight_ = false;  // the thread has not finished `save` and its actions
  std::exception_ptr error_;
  std::vector<std::function<void()>> queued_;
};

}  // namespace lockstep
