// Fuzzes the IDX reader (raw and gzipped): damaged dataset downloads must end
// in lockstep::Error naming the file, never a crash or a huge allocation.
#include <cstddef>
#include <cstdint>

#include "lockstep/core/error.h"
#include "lockstep/data/idx_file.h"
#include "lockstep/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = lockstep::fuzz::write_input_file(data, size, ".idx");
  try {
    auto tensor = lockstep::read_idx_file(path);
    (void)tensor.numel();
  } catch (const lockstep::Error&) {
  }
  return 0;
}
