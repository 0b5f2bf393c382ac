#include "lockstep/launch/internal/launcher_output.h"

#include <unistd.h>

#include <cerrno>

#include "lockstep/core/status_line.h"

namespace lockstep {

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void say(const std::string& message) {
  StatusLine::for_stderr().write_above([&] { write_all(STDERR_FILENO, "lockstep run: " + message + "\n"); });
}

}  // namespace lockstep
