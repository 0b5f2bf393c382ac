// Internal to lockstep's C API (capi.cpp, capi_mpi.cpp): how a trainer is
// created and how a body runs with every exception turned into a status
// (Note [Nothing crosses the C boundary], capi.cpp). Not installed for users:
// include lockstep/lockstep.h.
#pragma once

#include <cstdint>
#include <functional>

#include "lockstep/lockstep.h"

namespace lockstep {

// Reads the config (with `count` overrides), runs `before` (null: nothing;
// the MPI variant starts the process group there) and builds the trainer.
lockstep_status create_trainer(const char* config_path, const char* const* overrides, int32_t count,
                               lockstep_trainer* out, const std::function<void()>& before);

}  // namespace lockstep
