// Fuzzes the PNG decoder (seeded with PNG files): see image_fuzz_body.h.
#include "lockstep/fuzz/image_fuzz_body.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lockstep::fuzz::decode_image_every_way(data, size);
  return 0;
}
