// The readers under fuzzing take paths, so each input goes to a scratch file
// first (one per process, rewritten for every input).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

namespace lockstep::fuzz {

inline const std::string& write_input_file(const uint8_t* data, size_t size, const std::string& suffix) {
  static const std::string path = "/tmp/lockstep_fuzz_" + std::to_string(::getpid()) + suffix;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace lockstep::fuzz
