#include "lockstep/hooks/progress_bar_hook.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/events/console_writer.h"

namespace lockstep {

ProgressBarHook::ProgressBarHook(StatusLine& line, double refresh_seconds, bool active)
    : Hook("ProgressBarHook"), line_(line), refresh_seconds_(refresh_seconds), active_(active && line.enabled()) {}

std::string ProgressBarHook::bar(double fraction, int width) {
  const double clamped = std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(std::floor(clamped * width));
  return "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(width - filled), '-') +
         "]";
}

bool ProgressBarHook::due() {
  const Clock::time_point now = Clock::now();
  if (last_draw_ && std::chrono::duration<double>(now - *last_draw_).count() < refresh_seconds_) return false;
  last_draw_ = now;
  return true;
}

void ProgressBarHook::before_train() {
  start_ = Clock::now();
  first_iter_ = trainer().iter();
  last_draw_.reset();
}

// Note [A status line in 80 columns]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// StatusLine cuts a line to the terminal's width (a wrapped line would break
// the in-place redraw), and a terminal whose size is unknown counts as 80
// columns. So the bar is compact, the loss and lr last but within 80 columns
// for runs of up to some 100k iterations:
//   train epoch 2/3 1200/2811 [####------]  43% eta 0:01:23 loss 0.4123 lr 0.0994
std::string ProgressBarHook::train_text(double elapsed_seconds) const {
  Trainer& t = trainer();
  const int64_t done = t.iter() + 1;  // after_step: this iteration has run
  const bool bounded = t.max_iter() < Trainer::kNoEnd;
  std::string text = "train";
  if (bounded && t.has_data_loader()) {
    const int64_t per_epoch = t.iters_per_epoch();
    const int64_t epochs = (t.max_iter() + per_epoch - 1) / per_epoch;
    text += fmt::format(" epoch {}/{}", std::min((done - 1) / per_epoch + 1, epochs), epochs);
  }
  if (bounded) {
    const double fraction = static_cast<double>(done) / static_cast<double>(std::max<int64_t>(t.max_iter(), 1));
    text += fmt::format(" {}/{} {} {:3.0f}%", done, t.max_iter(), bar(fraction, 10), fraction * 100);
    const int64_t remaining = t.max_iter() - done;
    const int64_t steps = done - first_iter_;
    const EventStorage& storage = t.storage();
    std::optional<double> eta;
    if (storage.has("time")) {
      eta = storage.history("time").median(1000) * static_cast<double>(remaining);
    } else if (steps > 0) {
      eta = elapsed_seconds / static_cast<double>(steps) * static_cast<double>(remaining);
    }
    if (eta) text += " eta " + format_duration(*eta);
  } else {
    text += fmt::format(" iter {}", done);
  }
  const auto latest = t.storage().latest();
  for (const char* name : {"loss", "lr"}) {
    auto found = latest.find(name);
    if (found != latest.end()) text += fmt::format(" {} {:.4g}", name, found->second.value);
  }
  return text;
}

void ProgressBarHook::after_step() {
  if (!active_) return;
  const bool last = trainer().iter() + 1 >= trainer().max_iter();
  if (!due() && !last) return;
  line_.show(train_text(std::chrono::duration<double>(Clock::now() - start_).count()));
}

void ProgressBarHook::after_train() {
  if (active_) line_.clear();
}

std::string ProgressBarHook::eval_text(const std::string& split, int64_t batches, int64_t total) {
  std::string text = fmt::format("{} batch {}", split, batches);
  if (total > 0) {
    text += fmt::format("/{} {}", total, bar(static_cast<double>(batches) / static_cast<double>(total), 10));
  }
  return text;
}

void ProgressBarHook::draw_eval(const std::string& split, int64_t batch_index) {
  if (!active_ || !due()) return;
  line_.show(eval_text(split, batch_index + 1, -1));
}

void ProgressBarHook::before_val_epoch() { last_draw_.reset(); }
void ProgressBarHook::after_val_iter(int64_t batch_index, const Batch&, const Batch&) { draw_eval("val", batch_index); }
void ProgressBarHook::after_val_epoch(const std::map<std::string, double>&) {
  if (active_) line_.clear();
  last_draw_.reset();
}
void ProgressBarHook::before_test_epoch() { last_draw_.reset(); }
void ProgressBarHook::after_test_iter(int64_t batch_index, const Batch&, const Batch&) {
  draw_eval("test", batch_index);
}
void ProgressBarHook::after_test_epoch(const std::map<std::string, double>&) {
  if (active_) line_.clear();
  last_draw_.reset();
}

namespace {
std::shared_ptr<Hook> build_progress_bar(const Config& config, const HookContext& context) {
  const double refresh = config.get<double>("refresh_s", 0.25);
  LOCKSTEP_CHECK(refresh > 0, config.where("refresh_s"), ": refresh_s must be positive, got ", refresh);
  // Rank 0's progress: the others would draw over it (or, under a launcher,
  // send it twice). Where nothing is drawn the hook is inactive and not
  // registered at all (Hook::active), so that logs, files and pipes read as
  // they did without it, the hook list included.
  const bool main = context.collectives->is_main_process();
  return std::make_shared<ProgressBarHook>(StatusLine::for_stderr(), refresh, main);
}
}  // namespace

LOCKSTEP_REGISTER(hook_registry(), "ProgressBarHook", build_progress_bar);

}  // namespace lockstep
