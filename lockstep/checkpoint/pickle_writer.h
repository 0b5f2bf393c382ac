// A writer of Python pickles (protocol 2) for the Python objects lockstep
// writes that libtorch's TorchScript pickler cannot: instances of Python
// classes, such as torch.distributed.checkpoint's Metadata dataclasses
// (dcp_checkpoint.cpp). It emits opcodes in the order given, like Python's
// own pickler; nothing is memoised, so a value written twice is two values.
//
//   lockstep::PickleWriter out;                          // PROTO 2
//   out.global("torch", "Size");                         // torch.Size((3, 4))
//   out.mark(); out.integer(3); out.integer(4); out.tuple();
//   out.tuple_of(1); out.reduce();
//   std::string bytes = out.finish();                    // pickle.loads(bytes) == torch.Size([3, 4])
#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

class PickleWriter {
 public:
  PickleWriter();

  void none();
  void boolean(bool value);
  void integer(int64_t value);
  void string(const std::string& text);       // a str (UTF-8)
  void global(const std::string& module, const std::string& name);

  void mark();
  void tuple();             // the values since the last mark() become a tuple
  void tuple_of(int count);  // the top `count` (0 to 3) values become a tuple
  void empty_list();
  void appends();           // the values since the last mark() are appended to the list below the mark
  void empty_dict();
  void set_items();         // key, value, ... since the last mark() go into the dict below the mark

  void new_object();  // class, argument tuple -> class.__new__(class, *arguments)
  void reduce();      // callable, argument tuple -> callable(*arguments)
  void build();       // object, state -> the object, its __setstate__(state) or __dict__.update(state)

  // The pickle, closed with STOP.
  std::string finish();

 private:
  void little(uint64_t value, int width);  // `width` bytes, little-endian
  std::string out_;
};

}  // namespace lockstep
