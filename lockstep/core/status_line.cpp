#include "lockstep/core/status_line.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace lockstep {
namespace {

// An application program command (ESC _ ... ESC \): a terminal shown one by
// mistake displays nothing, and no log line starts with it.
const char kRecordStart[] = "\033_lockstep-status;";
const char kRecordEnd[] = "\033\\";
const char kEraseLine[] = "\r\033[K";

void write_fully(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal: the line is lost, the run goes on
    done += static_cast<size_t>(n);
  }
}

}  // namespace

StatusLine::Mode StatusLine::choose_mode(bool is_terminal, const char* term, const char* status_to,
                                         const char* progress) {
  if (progress != nullptr && std::strcmp(progress, "0") == 0) return Mode::kOff;
  if (status_to != nullptr && std::strcmp(status_to, "launcher") == 0) return Mode::kRecords;
  if (is_terminal && (term == nullptr || std::strcmp(term, "dumb") != 0)) return Mode::kTerminal;
  return Mode::kOff;
}

StatusLine& StatusLine::for_stderr() {
  static StatusLine* line =
      new StatusLine(STDERR_FILENO, choose_mode(::isatty(STDERR_FILENO) != 0, std::getenv("TERM"),
                                                std::getenv("LOCKSTEP_STATUS_TO"), std::getenv("LOCKSTEP_PROGRESS")));
  return *line;
}

StatusLine::StatusLine(int fd, Mode mode, int width) : fd_(fd), mode_(mode), width_(width) {}

int StatusLine::columns() const {
  if (width_ > 0) return width_;
  winsize size{};
  if (::ioctl(fd_, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

void StatusLine::erase_locked() {
  if (mode_ == Mode::kTerminal && drawn_) write_fully(fd_, kEraseLine);
  drawn_ = false;
}

void StatusLine::draw_locked() {
  if (text_.empty()) return;
  // One column short of the width: a line that fills it would wrap on some
  // terminals, and \r then returns to the wrong row.
  const size_t room = static_cast<size_t>(std::max(columns() - 1, 1));
  write_fully(fd_, text_.size() > room ? text_.substr(0, room) : text_);
  drawn_ = true;
}

void StatusLine::show(const std::string& text) {
  if (mode_ == Mode::kOff) return;
  const std::string line = text.substr(0, text.find('\n'));
  std::lock_guard<std::mutex> lock(mutex_);
  if (mode_ == Mode::kRecords) {
    write_fully(fd_, status_record(line));
    return;
  }
  if (drawn_) write_fully(fd_, kEraseLine);
  text_ = line;
  draw_locked();
}

void StatusLine::clear() {
  if (mode_ == Mode::kOff) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (mode_ == Mode::kRecords) {
    write_fully(fd_, status_record(""));
    return;
  }
  erase_locked();
  text_.clear();
}

void StatusLine::print_above(const std::string& text) {
  write_above([&] { write_fully(fd_, text); });
}

void StatusLine::write_above(const std::function<void()>& write) {
  if (mode_ != Mode::kTerminal) {
    write();
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const bool was_drawn = drawn_;
  erase_locked();
  write();
  if (was_drawn) draw_locked();
}

std::string status_record(const std::string& text) { return kRecordStart + text + kRecordEnd + "\n"; }

std::optional<std::string> parse_status_record(const std::string& line, size_t from) {
  const size_t start = std::strlen(kRecordStart), end = std::strlen(kRecordEnd);
  std::string body = line.substr(std::min(from, line.size()));
  if (!body.empty() && body.back() == '\n') body.pop_back();
  if (body.size() < start + end || body.compare(0, start, kRecordStart) != 0 ||
      body.compare(body.size() - end, end, kRecordEnd) != 0) {
    return std::nullopt;
  }
  return body.substr(start, body.size() - start - end);
}

}  // namespace lockstep
