// The etcd backend of the elastic rendezvous (lockstep/launch/elastic_rendezvous.h):
// `lockstep run --rdzv-backend etcd --rdzv-endpoint h1:2379,h2:2379,h3:2379
// --rdzv-id JOB --nnodes MIN:MAX`. Rounds live on an etcd cluster (v3 API,
// lockstep/launch/etcd_client.h), so no node of the job is special: any node,
// the first one included, can die and the others meet again in the next round.
//
//   EtcdRendezvousSettings s;
//   s.etcd.endpoints = {"h1:2379", "h2:2379", "h3:2379"};
//   s.run_id = "job7"; s.token = token;
//   auto rdzv = lockstep::make_etcd_rendezvous(options, s);
//   auto round = rdzv->join(-1, false, interrupted);  // round->store_host:store_port: where the workers meet
//
// Note [A rendezvous with no special node]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Liveness comes from a lease: each launcher holds one (lease_ttl, kept alive
// every third of it), and its entry in a round is put with it, so a node that
// dies leaves every round by itself once its lease runs out. A round is closed
// by whichever node first sees it ready (MAX nodes, or MIN and the last call
// over), in one transaction that creates the round's "closed" record only if
// there is none: two nodes closing at once cannot disagree. While a round
// runs, every launcher watches the job's keys (etcd's watch, not polling) and
// ends the round when an admitted node's entry vanishes (its lease expired),
// when a node enters the next round because its workers failed, or when a
// new node asks to join a round of fewer than MAX nodes.
//
// The workers' store is not on etcd: node 0 of each round hosts a TCPStore
// for that round only, and publishes its address in the round (with its
// lease). If that node dies, its workers' peers fail or its lease expires,
// and the next round has another node 0. So the store lives exactly as long
// as the round that uses it. etcd would have served it too (an etcd-backed
// c10d store), but every key of Gloo's connection setup would then be a Raft
// write replicated to a quorum; BENCHMARKS.md ("The workers' store on etcd")
// measures both.
//
// Keys, under /lockstep/rdzv/<run id>/: "job" (the job token's check value:
// a node with another token is refused), and under job/<hash of the token>/
// (Note [The store's job token]: without the token no one can name them):
// open (the round taking entries), round/<r>/node/<name> ("<nproc> <previous
// round> <previous rank>", leased), round/<r>/failed, round/<r>/closed
// ("<restarts>" then the admitted names, one per line, by group rank),
// round/<r>/store ("<host> <port>", leased), finished, abort.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/launch/elastic_rendezvous.h"
#include "lockstep/launch/etcd_client.h"

namespace lockstep {

struct EtcdRendezvousSettings {
  EtcdOptions etcd;
  std::string run_id;  // --rdzv-id: the job's name on the etcd cluster
  std::string token;   // the job token (required)
  std::chrono::seconds lease_ttl{10};
  // The address other nodes reach this one at, for the round's store when
  // this node is node 0 (--local-addr); empty: the local address of this
  // node's connection to etcd.
  std::string local_addr;
};

std::unique_ptr<ElasticRendezvous> make_etcd_rendezvous(ElasticRendezvous::Options options,
                                                        EtcdRendezvousSettings settings);

}  // namespace lockstep
