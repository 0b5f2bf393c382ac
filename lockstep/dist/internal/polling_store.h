// A view of a c10d store whose waits never hold the connection: `wait` and
// `get` poll `check` until the keys exist, so that while one thread waits for
// a key, another thread of the same process can still set one through the
// same TCPStore client (Note [Waiting without holding the store]).
//
//   auto store = lockstep::make_polling_store(compat::make_prefix_store("gloo/", group_store), timeout,
//                                             "group 'metrics'");
//   auto gloo = compat::make_gloo(store, rank, size, timeout);  // Gloo's key exchange waits here
//
// Everything else (set, add, check, deleteKey, compareSet) goes straight to
// the wrapped store.
#pragma once

#include <chrono>
#include <string>

#include "lockstep/compat/c10d.h"

namespace lockstep {

// `timeout` bounds a wait that names none; `where` names the store in the
// error a timed-out wait throws ("... waiting in group 'metrics' for keys [1]").
c10::intrusive_ptr<compat::C10dStore> make_polling_store(c10::intrusive_ptr<compat::C10dStore> store,
                                                         std::chrono::milliseconds timeout, std::string where);

}  // namespace lockstep
