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

void seed_everything(uint64_t seed);
State capture_rng_state();
void restore_rng_state(const State& state);

}  // namespace lockstep
