// torchrun's rendezvous arguments, applied to LaunchOptions, so that a
// torchrun command line works with `lockstep run` unchanged:
//
//   LaunchOptions o;
//   apply_nnodes("2:4", o);                        // elastic: min_nodes 2, nnodes 4
//   apply_rdzv_endpoint("10.0.0.1:29400", o);      // master_addr, master_port
//   apply_rdzv_conf("last_call_timeout=5,join_timeout=120", o);
//   apply_rdzv_endpoint("h1:2379,h2:2379,h3:2379", o);   // etcd's cluster (--rdzv-backend etcd)
//   apply_rdzv_conf("protocol=https,cacert=ca.pem,cert=node.pem,key=node-key.pem,lease_ttl=10", o);
//
// Each throws lockstep::Error naming the argument and what it accepts.
#pragma once

#include <string>

#include "lockstep/launch/launcher.h"

namespace lockstep {

// "N" (a fixed job of N nodes) or "MIN:MAX" (an elastic job).
void apply_nnodes(const std::string& text, LaunchOptions& options);
// "HOST[:PORT]" (the port defaults to 29400, torchrun's), or for etcd a
// comma-separated list of them.
void apply_rdzv_endpoint(const std::string& text, LaunchOptions& options);
// "KEY=VALUE,..." with keys last_call_timeout and join_timeout (seconds), and
// for etcd lease_ttl (seconds), protocol (http, https), cacert, cert, key
// (files) and user (the password comes from LOCKSTEP_ETCD_PASSWORD).
void apply_rdzv_conf(const std::string& text, LaunchOptions& options);

}  // namespace lockstep
