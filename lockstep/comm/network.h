// Which local address a process should bind its Gloo transport to, so that a
// multi-host job talks over the interface that actually reaches the other
// hosts, not over whatever the host name happens to resolve to.
//
//   std::string address = lockstep::local_address_towards("10.0.0.1", 29500);
//   // "10.0.0.2" on the host whose route to 10.0.0.1 leaves through 10.0.0.2
//
// The choice made by init_process_group (lockstep/comm/init.h):
//   1. GLOO_SOCKET_IFNAME set (by hand or `lockstep run --socket-ifname`):
//      those interfaces, as in PyTorch;
//   2. master on loopback, or one process: 127.0.0.1;
//   3. otherwise the source address the kernel's routing table picks for the
//      master's address -- the interface that reaches node 0 reaches the
//      others in any flat network;
//   4. if that cannot be determined: Gloo's default (the host name's address).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lockstep/compat/c10d.h"

namespace lockstep {

// "localhost", 127.x.x.x or ::1.
bool is_loopback_host(const std::string& host);

// Whether `host` names this machine: loopback, or an address of one of its
// interfaces (the launcher that hosts an elastic job's store is the one at
// --master-addr).
bool is_local_host(const std::string& host);

// Whether something listens at host:port (a plain TCP connect, closed at once).
bool accepts_connections(const std::string& host, int port);

// The local address of the interface this host uses to reach host:port,
// found by connecting a UDP socket (no packet is sent). Empty when the host
// does not resolve or no route leads to it.
std::string local_address_towards(const std::string& host, int port);

// Where Gloo binds by the rules above; `interfaces` is GLOO_SOCKET_IFNAME's
// list (comm/env.h reads it).
compat::GlooDeviceSpec gloo_device_for(const std::vector<std::string>& interfaces, const std::string& master_addr,
                                       int master_port, int world_size);
// This host's ephemeral ports (net.ipv4.ip_local_port_range), from which
// bind(port 0) and connect() take theirs; nullopt where unreadable.
struct PortRange {
  int low = 0, high = -1;
  int count() const { return high - low + 1; }
};
std::optional<PortRange> ephemeral_port_range();

// A warning for the log when `ranks_on_host` ranks of a `world_size` job,
// each binding a listening port per peer while Gloo's mesh connects (Gloo
// of libtorch 1.13), take more than a quarter of `range`; empty otherwise
// (Note [Ports for a mesh on one host]).
std::string mesh_port_warning(int ranks_on_host, int world_size, const PortRange& range);

// What gloo_device_for chose, for the log ("GLOO_SOCKET_IFNAME=eth1,eth2", "10.0.0.2",
// "the host name's address").
std::string describe(const compat::GlooDeviceSpec& device);

}  // namespace lockstep
