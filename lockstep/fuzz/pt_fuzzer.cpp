// Fuzzes the PyTorch .pt reader (zip archive, then lockstep's restricted
// unpickler of data.pkl): a damaged or hostile file must end in
// lockstep::Error, never a crash, an out-of-bounds read or a huge allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "lockstep/checkpoint/pt_file.h"
#include "lockstep/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    (void)lockstep::read_pt_state_dict_from_bytes(bytes, "fuzz.pt");
  } catch (const lockstep::Error&) {
  }
  return 0;
}
