// Test-only helpers: write IDX files (raw or gzipped) byte by byte, so tests
// can build good and deliberately broken fixtures in a TempDir.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "tests/support/test_support.h"

namespace lockstep::testing {

// Big-endian IDX header (magic, then one 32-bit size per entry of `sizes`)
// followed by `payload`. The header is written as asked, so it may lie.
inline std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& sizes, const std::string& payload) {
  std::string out;
  auto put32 = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xFF));
  };
  put32(magic);
  for (uint32_t size : sizes) put32(size);
  return out + payload;
}

// `count` bytes 0, 1, 2, ... (mod 256).
inline std::string ramp(size_t count) {
  std::string bytes(count, '\0');
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<char>(i & 0xFF);
  return bytes;
}

// Writes `content` gzipped to `path` (which should end in .gz) with the
// system's gzip, a compressor independent of the zlib reader under test.
inline void write_gzip_file(const std::string& path, const std::string& content) {
  const std::string suffix = ".gz";
  LOCKSTEP_CHECK(path.size() > suffix.size() && path.compare(path.size() - 3, 3, suffix) == 0,
                 "write_gzip_file: ", path, " should end in .gz");
  const std::string plain = path.substr(0, path.size() - 3);
  write_file(plain, content);
  const CommandResult result = run_command({"gzip", "-n", "-f", plain});
  LOCKSTEP_CHECK(result.exit_code == 0, "gzip ", plain, " failed: ", result.output);
}

}  // namespace lockstep::testing
