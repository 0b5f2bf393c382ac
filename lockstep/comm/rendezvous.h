// Store-level rendezvous: every member of a group checks in under the group's
// store prefix, and all wait until the whole group has. Unlike c10d's own
// "wait for workers", a short group ends in an error that says how many ranks
// arrived and which are missing, never in an endless wait. The ranks wait in
// one call of `store`'s wait: a group built while other threads may use the
// same store client passes a polling view (Note [Waiting without holding the
// store]).
//
//   lockstep::rendezvous(store, "world", rank, world_size, timeout,
//                        "check that WORLD_SIZE matches the number of workers");
#pragma once

#include <chrono>
#include <string>

#include "lockstep/compat/c10d.h"

namespace lockstep {

// Throws TimeoutError naming the missing ranks after `timeout`, and Error when
// two processes claim the same rank. `hint` is appended to the timeout message.
void rendezvous(const c10::intrusive_ptr<compat::C10dStore>& store, const std::string& group_name, int rank,
                int size, std::chrono::milliseconds timeout, const std::string& hint = "");

}  // namespace lockstep
