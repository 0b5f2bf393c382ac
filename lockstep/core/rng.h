// Random number state: seeding and capturing it for bitwise resume.
//
//   lockstep::seed_everything(42);                 // torch CPU (and CUDA) generators
//   lockstep::State rng = lockstep::capture_rng_state();
//   ...
//   lockstep::restore_rng_state(rng);              // the same numbers come out again
#pragma once

#include <cstdint>

#include "lockstep/core/state.h"

namespace lockstep {

// Sebastiano Vigna's splitmix64 step: a well-mixed 64-bit value from any
// input (derived seeds, hashes). Stable across platforms and versions.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

void seed_everything(uint64_t seed);
State capture_rng_state();
void restore_rng_state(const State& state);

}  // namespace lockstep
