#include "lockstep/data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08X", value);
  return text;
}

// gzFile with RAII and reads that report how many bytes really arrived.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      LOCKSTEP_FAIL(path, ": cannot open: ", std::strerror(errno));
    }
    gzbuffer(file_, 1 << 17);
  }
  ~GzReader() {
    if (file_ != nullptr) gzclose(file_);
  }
  C10_DISABLE_COPY_AND_ASSIGN(GzReader);

  // Reads up to `length` bytes; returns how many were read (short only at the end of the data).
  // A gzip stream that ends early reads as a short file and sets cut_short().
  int64_t read(void* buffer, int64_t length) {
    int64_t total = 0;
    auto* out = static_cast<char*>(buffer);
    while (total < length && cut_short_.empty()) {
      const auto chunk = static_cast<unsigned>(std::min<int64_t>(length - total, 1 << 30));
      const int got = gzread(file_, out + total, chunk);
      if (got > 0) {
        total += got;
        continue;
      }
      int code = Z_OK;
      const char* message = gzerror(file_, &code);
      // zlib reports a stream cut short as the end of the data plus Z_BUF_ERROR.
      if (code == Z_BUF_ERROR) {
        cut_short_ = message ? message : "unexpected end of file";
        break;
      }
      if (got == 0) break;
      LOCKSTEP_FAIL(path_, ": cannot read",
                    code == Z_ERRNO ? str_cat(": ", std::strerror(errno))
                                    : str_cat(" (corrupt gzip data?): ", message ? message : "zlib error"));
    }
    return total;
  }

  // Why the gzip stream ended before its end marker; empty when it did not.
  const std::string& cut_short() const { return cut_short_; }

  // Counts the bytes left (for the trailing-bytes message).
  int64_t count_rest() {
    std::vector<char> scratch(1 << 16);
    int64_t total = 0;
    while (true) {
      const int64_t got = read(scratch.data(), static_cast<int64_t>(scratch.size()));
      total += got;
      if (got < static_cast<int64_t>(scratch.size())) return total;
    }
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
  std::string cut_short_;
};

}  // namespace

torch::Tensor read_idx_file(const std::string& path, uint32_t expected_magic) {
  GzReader reader(path);
  unsigned char magic_bytes[4];
  int64_t got = reader.read(magic_bytes, 4);
  LOCKSTEP_CHECK(got == 4, path, ": not an IDX file: it holds only ", got, " bytes, too few for a header");
  const uint32_t magic = (uint32_t{magic_bytes[0]} << 24) | (uint32_t{magic_bytes[1]} << 16) |
                         (uint32_t{magic_bytes[2]} << 8) | uint32_t{magic_bytes[3]};
  const int ndim = magic_bytes[3];
  LOCKSTEP_CHECK(magic_bytes[0] == 0 && magic_bytes[1] == 0 && ndim >= 1, path,
                 ": not an IDX file: bad magic number ", hex32(magic),
                 " (expected 0x000008NN for unsigned bytes in NN dimensions)");
  LOCKSTEP_CHECK(magic_bytes[2] == 0x08, path, ": unsupported IDX element type ", hex32(magic_bytes[2]),
                 " in magic ", hex32(magic), "; only unsigned bytes (0x08) are read");
  if (expected_magic != 0) {
    LOCKSTEP_CHECK(magic == expected_magic, path, ": wrong magic number ", hex32(magic), ", expected ",
                   hex32(expected_magic), " (", (expected_magic & 0xFF), " dimension",
                   (expected_magic & 0xFF) == 1 ? "" : "s", "); is this the right file?");
  }

  std::vector<unsigned char> dim_bytes(4 * ndim);
  got = reader.read(dim_bytes.data(), 4 * ndim);
  LOCKSTEP_CHECK(got == 4 * ndim, path, ": truncated header: magic ", hex32(magic), " announces ", ndim,
                 " dimensions (", 4 * ndim, " bytes of sizes), file holds ", got);
  std::vector<int64_t> sizes(ndim);
  std::string shape;
  int64_t bytes = 1;
  for (int d = 0; d < ndim; ++d) {
    const unsigned char* b = &dim_bytes[4 * d];
    sizes[d] = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    shape += (d == 0 ? "" : "x") + std::to_string(sizes[d]);
    // Sizes are below 2^32 each; stop before the product could overflow.
    LOCKSTEP_CHECK(sizes[d] == 0 || bytes <= (int64_t{1} << 40) / sizes[d], path,
                   ": implausible IDX sizes ", shape, "... (over 2^40 bytes)");
    bytes *= sizes[d];
  }

  // Memory grows as data arrives, not as the header claims: a 21-byte file
  // claiming gigabytes fails as truncated instead of allocating them (fuzz_idx).
  std::vector<uint8_t> data;
  constexpr int64_t kChunk = int64_t{1} << 22;
  got = 0;
  while (got < bytes) {
    const int64_t want = std::min(kChunk, bytes - got);
    data.resize(static_cast<size_t>(got + want));
    const int64_t arrived = reader.read(data.data() + got, want);
    got += arrived;
    if (arrived < want) break;
  }
  LOCKSTEP_CHECK(got == bytes, path, ": truncated: header says ", shape, " = ", bytes, " bytes, file holds ", got,
                 reader.cut_short().empty() ? "" : str_cat(" (the gzip stream ends early: ", reader.cut_short(), ")"));
  const int64_t extra = reader.count_rest();
  LOCKSTEP_CHECK(extra == 0, path, ": ", extra, " trailing bytes: header says ", shape, " = ", bytes,
                 " bytes, file holds ", bytes + extra);
  auto tensor = torch::empty(sizes, torch::kUInt8);
  if (bytes > 0) std::memcpy(tensor.data_ptr<uint8_t>(), data.data(), static_cast<size_t>(bytes));
  return tensor;
}

}  // namespace lockstep
