// ProtoEncoder: writes protocol buffer messages in the wire format, by field
// number, without a protobuf library or generated code.
//
// TensorBoard's event files hold a handful of small messages (Event, Summary,
// HistogramProto); encoding them by hand keeps lockstep free of a protobuf
// dependency. Fields are appended in call order; proto3 readers accept any
// order, and repeated calls for one field number make a repeated field.
//
//   lockstep::ProtoEncoder value;
//   value.add_string(1, "loss").add_float(2, 0.25f);          // Summary.Value{tag, simple_value}
//   lockstep::ProtoEncoder summary;
//   summary.add_message(1, value);                            // Summary{repeated Value value = 1}
//   lockstep::ProtoEncoder event;
//   event.add_double(1, wall_time).add_int64(2, step).add_message(5, summary);
//   std::string bytes = event.bytes();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

class ProtoEncoder {
 public:
  // Varint fields: int32, int64, uint32, uint64, bool, enum. Negative values
  // take ten bytes, as protobuf encodes negative int32/int64.
  ProtoEncoder& add_int64(int field, int64_t value);
  ProtoEncoder& add_uint64(int field, uint64_t value);
  ProtoEncoder& add_bool(int field, bool value) { return add_uint64(field, value ? 1 : 0); }
  // Fixed-width fields: double (fixed64) and float (fixed32), little-endian.
  ProtoEncoder& add_double(int field, double value);
  ProtoEncoder& add_float(int field, float value);
  // Length-delimited fields: string, bytes, an embedded message.
  ProtoEncoder& add_string(int field, const std::string& value);
  ProtoEncoder& add_bytes(int field, const std::string& value) { return add_string(field, value); }
  ProtoEncoder& add_message(int field, const ProtoEncoder& message) { return add_string(field, message.bytes()); }
  // `repeated double` with [packed = true] (proto3's default for scalars).
  ProtoEncoder& add_packed_doubles(int field, const std::vector<double>& values);

  const std::string& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

 private:
  enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };
  void put_key(int field, WireType type);
  void put_varint(uint64_t value);
  void put_fixed(uint64_t value, int bytes);
  std::string bytes_;
};

}  // namespace lockstep
