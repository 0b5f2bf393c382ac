// A client connection to the launcher's rendezvous store, for the launchers'
// own bookkeeping (restart rounds, elastic rounds).
//
//   auto store = lockstep::connect_store("10.0.0.1", 29500, std::chrono::seconds(5));
//   store->set("key", {'1'});
//
// `timeout` bounds connecting and every operation on the connection (c10d
// counts connect timeouts in whole seconds, so at least 1 s is used); a
// caller that must survive an outage drops the connection on an error and
// connects again.
#pragma once

#include <chrono>
#include <string>

#include "lockstep/compat/c10d.h"

namespace lockstep {

c10::intrusive_ptr<compat::C10dStore> connect_store(const std::string& host, int port,
                                                    std::chrono::milliseconds timeout);

}  // namespace lockstep
