// Splits a worker's output stream into lines and hands each one, prefixed
// (e.g. "[rank1]: "), to a sink in one piece, so that lines of different
// workers never interleave mid-line.
//
//   LinePrefixer out("[rank1]: ", [](const std::string& line) { write(1, line.data(), line.size()); });
//   out.feed(buffer, n);   // emits complete lines
//   out.flush();           // at end of stream: the unterminated rest, with '\n'
#pragma once

#include <functional>
#include <string>

namespace lockstep {

class LinePrefixer {
 public:
  using Sink = std::function<void(const std::string&)>;
  LinePrefixer(std::string prefix, Sink sink) : prefix_(std::move(prefix)), sink_(std::move(sink)) {}

  void feed(const char* data, size_t size);
  void flush();

 private:
  // A line longer than this is passed on in pieces rather than held forever.
  static constexpr size_t kMaxPending = 64 * 1024;
  std::string prefix_;
  Sink sink_;
  std::string pending_;
};

}  // namespace lockstep
