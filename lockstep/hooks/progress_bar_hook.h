// ProgressBarHook: a live progress bar while a run trains and evaluates, on a
// terminal only (Lightning's and tqdm's): rank 0's epoch, iteration and total,
// ETA, and the latest loss and lr, redrawn in place a few times a second at
// most, with log lines printed whole above it (core/status_line.h). Where
// stderr is no terminal it draws nothing, so logs, CI and pipes get exactly
// the lines they got without it.
//
//   default_hooks:
//     progress: {refresh_s: 0.25}   # the default; `progress: null` (or false, and on the command
//                                   # line --set default_hooks.progress=false) turns it off, and
//                                   # so does LOCKSTEP_PROGRESS=0 in the environment
//
//   train epoch 2/3 1200/2811 [####------]  43% eta 0:01:23 loss 0.4123 lr 0.0994
//   val batch 120
//
//   trainer.register_hooks({std::make_shared<lockstep::ProgressBarHook>(lockstep::StatusLine::for_stderr())});
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/core/status_line.h"
#include "lockstep/engine/hook.h"

namespace lockstep {

class ProgressBarHook : public Hook {
 public:
  // `line` must outlive the hook; `active` false: a rank that draws nothing.
  explicit ProgressBarHook(StatusLine& line, double refresh_seconds = 0.25, bool active = true);

  bool active() const override { return active_; }
  void before_train() override;
  void after_train() override;
  void after_step() override;
  void before_val_epoch() override;
  void after_val_iter(int64_t batch_index, const Batch& batch, const Batch& outputs) override;
  void after_val_epoch(const std::map<std::string, double>& metrics) override;
  void before_test_epoch() override;
  void after_test_iter(int64_t batch_index, const Batch& batch, const Batch& outputs) override;
  void after_test_epoch(const std::map<std::string, double>& metrics) override;

  // The training line for the trainer's state now, `elapsed` seconds after
  // the run's first step (tests; ETA from the step times when recorded).
  std::string train_text(double elapsed_seconds) const;
  // The evaluation line after `batches` batches of `total` (-1: unknown).
  static std::string eval_text(const std::string& split, int64_t batches, int64_t total);
  // "[####------]" for `fraction` of `width` cells.
  static std::string bar(double fraction, int width);

 private:
  using Clock = std::chrono::steady_clock;
  bool due();  // whether a redraw is due now (at most one per refresh period)
  void draw_eval(const std::string& split, int64_t batch_index);

  StatusLine& line_;
  double refresh_seconds_;
  bool active_;
  Clock::time_point start_;
  std::optional<Clock::time_point> last_draw_;
  int64_t first_iter_ = 0;
};

}  // namespace lockstep
