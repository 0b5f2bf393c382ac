#include "lockstep/events/proto_encoder.h"

#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep {

void ProtoEncoder::put_key(int field, WireType type) {
  // Field numbers 19000-19999 are reserved by protobuf; the upper bound is 2^29 - 1.
  LOCKSTEP_CHECK(field >= 1 && field <= (1 << 29) - 1 && !(field >= 19000 && field <= 19999),
                 "ProtoEncoder: invalid field number ", field);
  put_varint((static_cast<uint64_t>(field) << 3) | type);
}

void ProtoEncoder::put_varint(uint64_t value) {
  while (value >= 0x80) {
    bytes_.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  bytes_.push_back(static_cast<char>(value));
}

void ProtoEncoder::put_fixed(uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) bytes_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

ProtoEncoder& ProtoEncoder::add_int64(int field, int64_t value) {
  return add_uint64(field, static_cast<uint64_t>(value));
}

ProtoEncoder& ProtoEncoder::add_uint64(int field, uint64_t value) {
  put_key(field, kVarint);
  put_varint(value);
  return *this;
}

namespace {

// The IEEE bits of `value`, as protobuf's fixed32/fixed64 carry them.
template <typename Bits, typename Float>
uint64_t bits_of(Float value) {
  static_assert(sizeof(Bits) == sizeof(Float), "a float and its bits have one size");
  Bits bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

}  // namespace

ProtoEncoder& ProtoEncoder::add_double(int field, double value) {
  put_key(field, kFixed64);
  put_fixed(bits_of<uint64_t>(value), 8);
  return *this;
}

ProtoEncoder& ProtoEncoder::add_float(int field, float value) {
  put_key(field, kFixed32);
  put_fixed(bits_of<uint32_t>(value), 4);
  return *this;
}

ProtoEncoder& ProtoEncoder::add_string(int field, const std::string& value) {
  put_key(field, kLengthDelimited);
  put_varint(value.size());
  bytes_ += value;
  return *this;
}

ProtoEncoder& ProtoEncoder::add_packed_doubles(int field, const std::vector<double>& values) {
  put_key(field, kLengthDelimited);
  put_varint(values.size() * 8);
  for (double value : values) {
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    put_fixed(bits, 8);
  }
  return *this;
}

}  // namespace lockstep
