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
#pragma once

#include "lockstep/core/error.h"

namespace lockstep {

class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace lockstep

#define LOCKSTEP_ASSERT(condition, ...)                                                                 \
  do {                                                                                                  \
    if (!(condition)) {                                                                                 \
      throw ::lockstep::InternalError(::lockstep::str_cat(                                              \
          "lockstep internal error (a bug in lockstep; please report it) at ", __FILE__, ":", __LINE__, \
          ": ", #condition, ": ", __VA_ARGS__));                                                        \
    }                                                                                                   \
  } while (false)
