// The c10d backend of the elastic rendezvous (lockstep/launch/elastic_rendezvous.h),
// as torchrun's c10d rendezvous works: rounds live on the store the launcher
// at --rdzv-endpoint hosts (the coordinator), and the round's workers meet on
// that store too.
//
//   auto rdzv = lockstep::make_c10d_rendezvous(options, /*coordinator=*/hosts_the_store);
//
// Every launcher that wants to run joins the open round by taking a ticket
// (an atomic counter); the coordinator closes the round when MAX nodes hold
// tickets, or when at least MIN do and the last call has passed since the
// MIN-th arrived. A round after the first closes only once a node of the
// running round holds a ticket in it (the running round is over): new nodes
// alone wait for that. The first N tickets are admitted; a ticket past N
// waits for the next round. While a round runs, every admitted node watches
// the next one.
//
// Store keys, under "lockstep/elastic/": open (the round taking tickets),
// round/<r>/count, round/<r>/node/<ticket> ("<nproc> <previous round> <previous
// rank> <name>"), round/<r>/failed, round/<r>/closed ("<N> <restarts>"),
// finished, abort.
//
// Its weakness is torchrun's: the coordinator's machine holds the job. When
// it dies the survivors cannot meet again; the etcd backend has no such node.
#pragma once

#include <memory>

#include "lockstep/launch/elastic_rendezvous.h"

namespace lockstep {

// `coordinator`: this launcher hosts the store at options.host:port and closes the rounds.
std::unique_ptr<ElasticRendezvous> make_c10d_rendezvous(ElasticRendezvous::Options options, bool coordinator);

}  // namespace lockstep
