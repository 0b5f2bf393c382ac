// Job identity on the rendezvous store: only processes of this job, holding
// its token, reach the job's keys; anyone else is refused with an error that
// says why, and cannot disturb the job.
//
// Note [The store's job token]
// libtorch's TCPStore has no authentication and (on 1.13) listens on every
// interface. lockstep therefore never uses the store's key space directly:
// the host publishes a record {run id, SHA-256("lockstep-job-check:" + token)}
// under "lockstep/job", and members work under the prefix
// "job/<SHA-256("lockstep-job-keys:" + token)>/". A process with another token cannot
// compute that prefix from anything the store holds (the store has no key
// listing), so it can neither join nor overwrite the job's keys; reading the
// record tells it that it is refused. The two hashes differ in their
// leading string so that the check value, which anyone can read, does not
// give away the prefix; the record holds a hash, never the token. join_job
// also compares the run id (when the member knows one), so a process of
// another job that reached the same address and port is told so. Without
// LOCKSTEP_JOB_TOKEN a worker uses the whole store (comm/init.cpp): a job
// not started by `lockstep run`, or several of its launchers meeting on a
// loopback address, which it allows with a warning; it refuses to start a
// multi-node job without a token.
//
//   // The host (node 0's launcher, or rank 0 hosting its own store):
//   auto job_store = lockstep::publish_job(server, {"run7", token});
//   // Every member (launchers of other nodes, workers):
//   auto job_store = lockstep::join_job(client, {"run7", token}, timeout, "127.0.0.1:29500");
//
// The token comes from LOCKSTEP_JOB_TOKEN (or `lockstep run --job-token`);
// `lockstep run` makes a random one for a single-node job and passes it to
// its workers, and requires one shared by all nodes of a multi-node job.
#pragma once

#include <chrono>
#include <string>

#include "lockstep/compat/c10d.h"

namespace lockstep {

struct JobIdentity {
  std::string run_id;  // empty on a member: accept the host's run id
  std::string token;
};

// The job record's key in the store's shared key space.
inline constexpr const char* kJobRecordKey = "lockstep/job";

// Writes the job record and returns the job's private view of `store`.
c10::intrusive_ptr<compat::C10dStore> publish_job(const c10::intrusive_ptr<compat::C10dStore>& store,
                                                  const JobIdentity& job);

// Reads the job record (waiting for it up to `timeout`), checks the run id
// and the token, and returns the job's private view of `store`. Throws
// lockstep::Error ("refused by the job at <where>: ...") on a mismatch. When
// `run_id_out` is given it receives the host's run id.
c10::intrusive_ptr<compat::C10dStore> join_job(const c10::intrusive_ptr<compat::C10dStore>& store,
                                               const JobIdentity& job, std::chrono::milliseconds timeout,
                                               const std::string& where, std::string* run_id_out = nullptr);

// The record's check value, and the prefix of the job's private keys
// ("job/<hash>/"): for key-value stores other than c10d's (etcd's rendezvous).
std::string job_check_value(const JobIdentity& job);
std::string job_key_prefix(const JobIdentity& job);

// A random 128-bit token in hex, for single-node jobs.
std::string random_job_token();

// SHA-256 of `data` as 64 lowercase hex digits (FIPS 180-4).
std::string sha256_hex(const std::string& data);

}  // namespace lockstep
