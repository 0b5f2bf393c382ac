// Fuzzes the checkpoint and safetensors readers: a corrupt or hostile file
// must end in lockstep::Error (verify_checkpoint_file: a reason string),
// never a crash, an out-of-bounds read or a huge allocation.
#include <cstddef>
#include <cstdint>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/core/error.h"
#include "lockstep/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = lockstep::fuzz::write_input_file(data, size, ".ckpt");
  (void)lockstep::verify_checkpoint_file(path);
  try {
    (void)lockstep::read_checkpoint_file(path);
  } catch (const lockstep::Error&) {
  }
  try {
    (void)lockstep::read_safetensors_file(path);
  } catch (const lockstep::Error&) {
  }
  return 0;
}
