#include "lockstep/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/core/fault_point.h"

namespace lockstep {

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  std::filesystem::path target(path_);
  std::string pattern = (target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path()) /
                        ("." + target.filename().string() + ".tmp-XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  fd_ = mkstemp(buffer.data());
  if (fd_ < 0) fail("creating a temporary file next to it", errno);
  temp_path_ = buffer.data();
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::fail(const std::string& what, int error_number) {
  std::string reason = std::strerror(error_number);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  temp_path_.clear();
  const bool no_space = error_number == ENOSPC || error_number == EDQUOT || error_number == EFBIG;
  LOCKSTEP_FAIL("cannot write ", path_, ": ", what, " failed: ", reason,
                no_space ? " (the disk is full, or a quota or file size limit is reached; the previous version "
                           "of the file is untouched)"
                         : "");
}

void AtomicFileWriter::write(const void* data, size_t size) {
  LOCKSTEP_CHECK(fd_ >= 0 && !committed_, "AtomicFileWriter for ", path_, " is closed");
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, bytes, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("writing", errno);
    }
    bytes += n;
    size -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
  // Tests kill the process here to leave a half-written file (fault_injection.h).
  fault_point("write:" + std::filesystem::path(path_).filename().string());
}

void AtomicFileWriter::commit() {
  LOCKSTEP_CHECK(fd_ >= 0 && !committed_, "AtomicFileWriter for ", path_, " committed twice");
  if (::fsync(fd_) != 0) fail("fsync", errno);
  if (::fchmod(fd_, 0644) != 0) fail("chmod", errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("close", errno);
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("rename", errno);
  committed_ = true;
  sync_directory(std::filesystem::path(path_).parent_path().string());  // the rename itself
}

void sync_directory(const std::string& directory) {
  const int fd = ::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomically(const std::string& path, const std::string& content) {
  AtomicFileWriter out(path);
  out.write(content);
  out.commit();
}

}  // namespace lockstep
