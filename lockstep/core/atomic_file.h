// AtomicFileWriter: a file that appears whole or not at all.
//
// Bytes go to a temporary file in the destination's directory; commit()
// flushes them to disk (fsync), renames the file over the destination and
// syncs the directory. If anything fails -- a full disk, a crash, an
// exception -- the destination keeps its previous content and the temporary
// file is removed.
//
//   lockstep::AtomicFileWriter out("work_dirs/run/last_checkpoint");
//   out.write("model_0000999.ckpt");
//   out.commit();
#pragma once

#include <cstddef>
#include <string>

#include <c10/macros/Macros.h>

namespace lockstep {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();  // removes the temporary file unless committed
  C10_DISABLE_COPY_AND_ASSIGN(AtomicFileWriter);

  void write(const void* data, size_t size);
  void write(const std::string& text) { write(text.data(), text.size()); }
  void commit();
  size_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const std::string& what, int error_number);
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  size_t written_ = 0;
  bool committed_ = false;
};

// Makes the renames inside `directory` durable (an fsync of the directory;
// "" is the working directory). Best effort: a directory that cannot be
// opened is left as it is.
void sync_directory(const std::string& directory);

// Writes `content` to `path` atomically.
void write_file_atomically(const std::string& path, const std::string& content);

}  // namespace lockstep
