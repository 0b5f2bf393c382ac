#include "lockstep/core/crc32c.h"

#include <array>

namespace lockstep {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, bit-reversed
constexpr uint32_t kMaskDelta = 0xa282ead8u;

// Slicing-by-8 tables: event files are small, but histograms and images make
// records of tens of kilobytes, and a byte-at-a-time loop is needlessly slow.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t crc = i;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
      t[0][i] = crc;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (size_t k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
    }
  }
};

const Tables& tables() {
  static const Tables instance;
  return instance;
}

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size) {
  const auto& t = tables().t;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    const uint32_t low = c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    c = t[7][low & 0xffu] ^ t[6][(low >> 8) & 0xffu] ^ t[5][(low >> 16) & 0xffu] ^ t[4][low >> 24] ^ t[3][p[4]] ^
        t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xffu];
  return ~c;
}

uint32_t crc32c(const void* data, size_t size) { return crc32c_extend(0, data, size); }

uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

uint32_t unmask_crc32c(uint32_t masked) {
  const uint32_t rotated = masked - kMaskDelta;
  return (rotated >> 17) | (rotated << 15);
}

}  // namespace lockstep
