#include "lockstep/core/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep {

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOCKSTEP_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    LOCKSTEP_FAIL(path, ": cannot stat (", std::strerror(error), ")");
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    LOCKSTEP_FAIL(path, ": not a regular file");
  }
  std::string bytes(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int error = got < 0 ? errno : 0;
      ::close(fd);
      LOCKSTEP_FAIL(path, ": read failed after ", done, " of ", bytes.size(), " bytes",
                    error ? str_cat(" (", std::strerror(error), ")") : std::string(" (the file shrank)"));
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  return bytes;
}

}  // namespace lockstep
