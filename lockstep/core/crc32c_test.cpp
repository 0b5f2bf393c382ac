#include "lockstep/core/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace lockstep {
namespace {

// The definition, one bit at a time (reflected Castagnoli polynomial).
uint32_t bitwise_crc32c(const std::vector<uint8_t>& bytes) {
  uint32_t crc = 0xffffffffu;
  for (uint8_t byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

TEST(Crc32cTest, KnownVectors) {
  // The CRC catalogue's check value and the iSCSI test vectors of RFC 3720 (B.4).
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xff), ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<uint8_t>(i);
    descending[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending.data(), descending.size()), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, MatchesTheBitwiseDefinitionAtEveryLengthAndSplit) {
  std::mt19937 random(7);
  for (size_t length = 0; length < 80; ++length) {
    std::vector<uint8_t> bytes(length);
    for (auto& byte : bytes) byte = static_cast<uint8_t>(random());
    const uint32_t expected = bitwise_crc32c(bytes);
    EXPECT_EQ(crc32c(bytes.data(), bytes.size()), expected) << "length " << length;
    const size_t split = length / 3;
    EXPECT_EQ(crc32c_extend(crc32c(bytes.data(), split), bytes.data() + split, length - split), expected)
        << "length " << length << " split at " << split;
  }
}

TEST(Crc32cTest, MaskIsTensorFlowsRotateAndAdd) {
  // mask(0) = rotr(0, 15) + 0xa282ead8; mask(1) = (1 << 17) + 0xa282ead8.
  EXPECT_EQ(mask_crc32c(0u), 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(1u), 0xa282ead8u + 0x20000u);
  EXPECT_EQ(mask_crc32c(0x8000u), 0xa282ead8u + 1u);
  for (uint32_t value : {0u, 1u, 0xE3069283u, 0xffffffffu, 0x12345678u}) {
    EXPECT_EQ(unmask_crc32c(mask_crc32c(value)), value);
  }
}

}  // namespace
}  // namespace lockstep
