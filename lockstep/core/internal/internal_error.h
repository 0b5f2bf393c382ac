// LOCKSTEP_ASSERT: a broken internal invariant, as opposed to a user's error.
//
// LOCKSTEP_CHECK (core/error.h) is for what input can cause: a bad config, a
// corrupt file, a rank that disagrees. LOCKSTEP_ASSERT is for what no input
// can cause, such as a state machine asked for a transition it does not have.
// It throws lockstep::InternalError, whose message says it is a bug in
// lockstep and where, so it is never mistaken for the user's fault.
//
//   LOCKSTEP_ASSERT(phase_ == Phase::kReducing, "finalize outside a reducing pass");
//   // throws InternalError("lockstep internal error (a bug in lockstep; please report it) at
//   //                       reducer.cpp:212: phase_ == Phase::kReducing: finalize outside ...")
//
// A state machine moves through move_phase, which asserts the move is one of
// its edges: may_come_from[to] is the set of phases `to` may follow, one bit
// per phase (kFromAny: any of them).
//
//   enum class Phase { kIdle, kBusy };
//   constexpr unsigned kMayComeFrom[] = {kFromAny, phase_bit(Phase::kIdle)};
//   constexpr const char* kNames[] = {"idle", "busy"};
//   move_phase("the loader", phase_, Phase::kBusy, kMayComeFrom, kNames);
#pragma once

#include <cstddef>

#include "lockstep/core/error.h"

namespace lockstep {

class InternalError : public Error {
 public:
  using Error::Error;
};

inline constexpr unsigned kFromAny = ~0u;

template <typename Phase>
constexpr unsigned phase_bit(Phase phase) {
  return 1u << static_cast<unsigned>(phase);
}

template <typename Phase, size_t N>
void move_phase(const char* machine, Phase& phase, Phase to, const unsigned (&may_come_from)[N],
                const char* const (&names)[N]) {
  const auto from_index = static_cast<size_t>(phase);
  const auto to_index = static_cast<size_t>(to);
  if (to_index >= N || from_index >= N || (may_come_from[to_index] & phase_bit(phase)) == 0) {
    throw InternalError(str_cat("lockstep internal error (a bug in lockstep; please report it): ", machine,
                                " has no move from ", from_index < N ? names[from_index] : "?", " to ",
                                to_index < N ? names[to_index] : "?"));
  }
  phase = to;
}

}  // namespace lockstep

#define LOCKSTEP_ASSERT(condition, ...)                                                                 \
  do {                                                                                                  \
    if (!(condition)) {                                                                                 \
      throw ::lockstep::InternalError(::lockstep::str_cat(                                              \
          "lockstep internal error (a bug in lockstep; please report it) at ", __FILE__, ":", __LINE__, \
          ": ", #condition, ": ", __VA_ARGS__));                                                        \
    }                                                                                                   \
  } while (false)
