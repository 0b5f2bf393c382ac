// CRC-32C (Castagnoli), the checksum TFRecord files (TensorBoard event files)
// frame every record with, and its "masked" form.
//
// TFRecord stores masked CRCs so that a CRC computed over data that itself
// holds CRCs stays well distributed (the leveldb/TensorFlow convention).
//
//   uint32_t crc = lockstep::crc32c(data.data(), data.size());
//   uint32_t stored = lockstep::mask_crc32c(crc);     // what goes on disk
//   uint32_t again = lockstep::crc32c_extend(crc, more.data(), more.size());
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep {

// CRC-32C of `size` bytes; crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t size);
// Continues `crc` (a previous crc32c result) over more bytes.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);
// TFRecord's mask: rotate right by 15 bits and add 0xa282ead8.
uint32_t mask_crc32c(uint32_t crc);
uint32_t unmask_crc32c(uint32_t masked);

}  // namespace lockstep
