#include "lockstep/checkpoint/pickle_writer.h"

#include "lockstep/core/error.h"

namespace lockstep {

void PickleWriter::little(uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

PickleWriter::PickleWriter() : out_("\x80\x02") {}

void PickleWriter::none() { out_.push_back('N'); }

void PickleWriter::boolean(bool value) { out_.push_back(value ? '\x88' : '\x89'); }

void PickleWriter::integer(int64_t value) {
  if (value >= 0 && value < 256) {
    out_.push_back('K');  // BININT1
    little(static_cast<uint64_t>(value), 1);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out_.push_back('J');  // BININT, signed
    little(static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
  } else {
    out_ += "\x8a\x08";  // LONG1 of 8 bytes: two's complement, little-endian
    little(static_cast<uint64_t>(value), 8);
  }
}

void PickleWriter::string(const std::string& text) {
  LOCKSTEP_CHECK(text.size() <= UINT32_MAX, "PickleWriter: a string of ", text.size(), " bytes");
  out_.push_back('X');  // BINUNICODE
  little(text.size(), 4);
  out_ += text;
}

void PickleWriter::global(const std::string& module, const std::string& name) {
  LOCKSTEP_CHECK(module.find('\n') == std::string::npos && name.find('\n') == std::string::npos,
                 "PickleWriter: a global name with a line break");
  out_ += "c" + module + "\n" + name + "\n";
}

void PickleWriter::mark() { out_.push_back('('); }
void PickleWriter::tuple() { out_.push_back('t'); }

void PickleWriter::tuple_of(int count) {
  LOCKSTEP_CHECK(count >= 0 && count <= 3, "PickleWriter: tuple_of(", count, ")");
  static const char kOps[] = {')', '\x85', '\x86', '\x87'};  // EMPTY_TUPLE, TUPLE1, TUPLE2, TUPLE3
  out_.push_back(kOps[count]);
}

void PickleWriter::empty_list() { out_.push_back(']'); }
void PickleWriter::appends() { out_.push_back('e'); }
void PickleWriter::empty_dict() { out_.push_back('}'); }
void PickleWriter::set_items() { out_.push_back('u'); }
void PickleWriter::new_object() { out_.push_back('\x81'); }
void PickleWriter::reduce() { out_.push_back('R'); }
void PickleWriter::build() { out_.push_back('b'); }

std::string PickleWriter::finish() {
  out_.push_back('.');
  return out_;
}

}  // namespace lockstep
