// StatusLine: one line at the bottom of a terminal, redrawn in place (the
// training progress bar), with log lines printed whole above it, as tqdm and
// rich do.
//
//   lockstep::StatusLine& status = lockstep::StatusLine::for_stderr();
//   if (status.enabled()) status.show("train  epoch 1/3  120/2811 [#---------]  4%  eta 0:01:23  loss 0.4123");
//   status.print_above("[11/27 19:00:00 info] a log line\n");  // erase, write, redraw (the console log sink's way)
//   status.clear();                                            // the run is over: nothing is left drawn
//
// Where stderr is no terminal (CI, files, pipes), for_stderr() is disabled and
// show() and clear() do nothing, so such output is what it was without it.
// A worker that `lockstep run` (or `lockstep train --nproc`) started on a
// terminal has no terminal of its own: the launcher asks it, through
// LOCKSTEP_STATUS_TO=launcher, to send its status lines as records on stderr
// (status_record below), and draws them on its own terminal, above which it
// prints every worker's lines (Note [One status line for a whole job]).
#pragma once

#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include <c10/macros/Macros.h>

namespace lockstep {

class StatusLine {
 public:
  enum class Mode {
    kOff,       // nothing is drawn
    kTerminal,  // drawn in place on `fd`, a terminal
    kRecords,   // sent as status records on `fd`, for the launcher to draw
  };
  // The process's line on stderr: kTerminal when stderr is a terminal whose
  // TERM is not "dumb", kRecords when LOCKSTEP_STATUS_TO=launcher, else kOff;
  // LOCKSTEP_PROGRESS=0 turns it off in every case.
  static StatusLine& for_stderr();
  // The mode for_stderr() chooses, from the facts it reads (tests).
  static Mode choose_mode(bool is_terminal, const char* term, const char* status_to, const char* progress);

  StatusLine(int fd, Mode mode, int width = 0);
  C10_DISABLE_COPY_AND_ASSIGN(StatusLine);

  bool enabled() const { return mode_ != Mode::kOff; }
  Mode mode() const { return mode_; }
  // Replaces the line's text (one line; cut to the terminal's width).
  void show(const std::string& text);
  // Erases the line; nothing is drawn until the next show().
  void clear();
  // Writes `text` (whole lines) above the line: erase, write, redraw.
  void print_above(const std::string& text);
  // The same for a writer of its own (a colour log sink) on the same terminal.
  void write_above(const std::function<void()>& write);

 private:
  void erase_locked();
  void draw_locked();
  int columns() const;

  std::mutex mutex_;
  int fd_;
  Mode mode_;
  int width_;  // 0: ask the terminal
  std::string text_;
  bool drawn_ = false;
};

// A status record as a worker sends it (kRecords): one line of its own.
std::string status_record(const std::string& text);
// The text of a status record, if `line` (without its trailing newline, from
// offset `from`) is one.
std::optional<std::string> parse_status_record(const std::string& line, size_t from = 0);

}  // namespace lockstep
