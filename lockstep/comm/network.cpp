#include "lockstep/comm/network.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "lockstep/core/error.h"

namespace lockstep {

namespace {

std::string source_address(const addrinfo& target) {
  const int fd = ::socket(target.ai_family, SOCK_DGRAM, 0);
  if (fd < 0) return "";
  std::string address;
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (::connect(fd, target.ai_addr, target.ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
    char text[INET6_ADDRSTRLEN] = {0};
    const void* raw = local.ss_family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr);
    if (::inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) address = text;
  }
  ::close(fd);
  return address;
}

}  // namespace

// Note [Ports for a mesh on one host]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// libtorch 1.13's Gloo binds a listening socket, on a port the kernel picks
// from the ephemeral range, for every pair of a mesh while it connects. With
// R ranks of an N-rank job on one host that is R (N - 1) ports at once: 128
// ranks on one host took 16,256 of the default 28,232 (32768-60999), and
// connecting took 30-40 s, 95-97% of it system time in the kernel's search
// for a free port (inet_csk_get_port); widening the range to 10000-65000 took
// it to 15-18 s (BENCHMARKS.md, "Where the time goes at 128 light ranks").
// lockstep cannot change how the linked Gloo binds, so local rank 0 says so
// when the ranks on its host will take more than a quarter of the range, with
// the remedy. A rank cannot widen the range itself (it is a host setting that
// needs root). libtorch 2.x's Gloo listens on one port per process.

std::optional<PortRange> ephemeral_port_range() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  PortRange range;
  if (!(in >> range.low >> range.high) || range.count() <= 0) return std::nullopt;
  return range;
}

std::string mesh_port_warning(int ranks_on_host, int world_size, const PortRange& range) {
  const long ports = static_cast<long>(ranks_on_host) * (world_size - 1);
  if (ranks_on_host <= 0 || range.count() <= 0 || 4 * ports <= range.count()) return "";
  return str_cat(ranks_on_host, " ranks on this host each bind a listening port per peer while Gloo connects (",
                 "libtorch 1.13): ", ports, " ports, ", 100 * ports / range.count(), "% of this host's ",
                 range.count(), " ephemeral ports (net.ipv4.ip_local_port_range ", range.low, "-", range.high,
                 "); the kernel's search for free ports then slows connecting",
                 ports > range.count() ? ", and some binds may fail" : "",
                 ". Widen the range (as root: sysctl -w net.ipv4.ip_local_port_range=\"10000 65000\") or run "
                 "fewer ranks per host");
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string address;
  for (addrinfo* entry = found; entry != nullptr && address.empty(); entry = entry->ai_next) {
    address = source_address(*entry);
  }
  ::freeaddrinfo(found);
  return address;
}

bool is_local_host(const std::string& host) {
  if (is_loopback_host(host)) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0) return false;
  bool local = false;
  for (addrinfo* entry = found; entry != nullptr && !local; entry = entry->ai_next) {
    char text[NI_MAXHOST] = {0};
    if (::getnameinfo(entry->ai_addr, entry->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) continue;
    // The kernel answers a route to one of this machine's own addresses with that address.
    local = source_address(*entry) == text;
  }
  ::freeaddrinfo(found);
  return local;
}

bool accepts_connections(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool accepted = false;
  for (addrinfo* entry = found; entry != nullptr && !accepted; entry = entry->ai_next) {
    const int fd = ::socket(entry->ai_family, entry->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    accepted = ::connect(fd, entry->ai_addr, entry->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return accepted;
}

compat::GlooDeviceSpec gloo_device_for(const std::vector<std::string>& interfaces, const std::string& master_addr,
                                       int master_port, int world_size) {
  compat::GlooDeviceSpec device;
  if (!interfaces.empty()) {
    device.interfaces = interfaces;
  } else if (world_size == 1 || is_loopback_host(master_addr)) {
    device.host = "127.0.0.1";
  } else {
    device.host = local_address_towards(master_addr, master_port);
  }
  return device;
}

std::string describe(const compat::GlooDeviceSpec& device) {
  if (!device.interfaces.empty()) {
    std::string names;
    for (const auto& name : device.interfaces) names += (names.empty() ? "" : ",") + name;
    return "GLOO_SOCKET_IFNAME=" + names;
  }
  return device.host.empty() ? "the host name's address" : device.host;
}

}  // namespace lockstep
