// Unit tests of the Gloo bind-address choice (lockstep/comm/network.h). The
// multi-host behaviour itself is tested across network namespaces by
// tests/multinode/multinode_test.sh.
#include <gtest/gtest.h>

#include <fstream>

#include "lockstep/core/error.h"
#include "lockstep/comm/env.h"
#include "lockstep/comm/network.h"

namespace lockstep {
namespace {

TEST(Network, LoopbackIsReachedFromLoopback) {
  EXPECT_EQ(local_address_towards("127.0.0.1", 29500), "127.0.0.1");
  const std::string local = local_address_towards("localhost", 29500);
  EXPECT_TRUE(local.rfind("127.", 0) == 0 || local == "::1") << local;
}

TEST(Network, UnknownHostHasNoAddress) {
  EXPECT_EQ(local_address_towards("no-such-host.invalid", 29500), "");
}

TEST(Network, BindAddressFollowsTheRules) {
  auto host = [](const std::string& master, int world) { return gloo_device_for({}, master, 29500, world).host; };
  EXPECT_EQ(host("127.0.0.1", 4), "127.0.0.1");
  EXPECT_EQ(host("localhost", 4), "127.0.0.1");
  EXPECT_EQ(host("some.other.host.invalid", 1), "127.0.0.1");
  // Not resolvable: left to Gloo's default, which then reports its own error.
  EXPECT_EQ(host("some.other.host.invalid", 4), "");
  EXPECT_EQ(describe(gloo_device_for({}, "some.other.host.invalid", 29500, 4)), "the host name's address");
  // Named interfaces win (GLOO_SOCKET_IFNAME, or `lockstep run --socket-ifname`).
  auto named = gloo_device_for({"lo", "eth1"}, "127.0.0.1", 29500, 4);
  EXPECT_EQ(named.interfaces, (std::vector<std::string>{"lo", "eth1"}));
  EXPECT_EQ(named.host, "");
  EXPECT_EQ(describe(named), "GLOO_SOCKET_IFNAME=lo,eth1");
}

TEST(Network, EphemeralPortsAreThisHosts) {
  const std::optional<PortRange> range = ephemeral_port_range();
  ASSERT_TRUE(range.has_value());
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  ASSERT_TRUE(in >> low >> high);
  EXPECT_EQ(range->low, low);
  EXPECT_EQ(range->high, high);
  EXPECT_EQ(range->count(), high - low + 1);
}

TEST(Network, ManyRanksOnOneHostAreWarnedOfTheirPorts) {
  const PortRange linux_default{32768, 60999};  // 28,232 ports
  // 8 ranks per host of 64, or of 883 (7,056 ports, 24.99%): nothing to say.
  EXPECT_EQ(mesh_port_warning(8, 64, linux_default), "");
  EXPECT_EQ(mesh_port_warning(8, 883, linux_default), "");
  EXPECT_EQ(mesh_port_warning(0, 128, linux_default), "");
  // 8 of 884 (7,064 ports): over a quarter.
  EXPECT_NE(mesh_port_warning(8, 884, linux_default), "");
  // This machine's 128-rank job.
  const std::string at_128 = mesh_port_warning(128, 128, linux_default);
  for (const std::string& part :
       {std::string("128 ranks on this host each bind a listening port per peer while Gloo connects (libtorch 1.13): "
                    "16256 ports, 57% of this host's 28232 ephemeral ports (net.ipv4.ip_local_port_range "
                    "32768-60999)"),
        std::string("sysctl -w net.ipv4.ip_local_port_range=\"10000 65000\"")}) {
    EXPECT_NE(at_128.find(part), std::string::npos) << part << "\n" << at_128;
  }
  EXPECT_EQ(at_128.find("may fail"), std::string::npos) << at_128;
  // More ports than the host has.
  EXPECT_NE(mesh_port_warning(128, 300, linux_default).find("some binds may fail"), std::string::npos);
  // Widened as the warning says, 128 ranks take 29%: still said.
  EXPECT_NE(mesh_port_warning(128, 128, PortRange{10000, 65000}), "");
}

TEST(Network, SocketInterfacesAreReadFromTheEnvironmentOnce) {
  EXPECT_EQ(gloo_socket_interfaces(Environment{}), std::vector<std::string>{});
  EXPECT_EQ(gloo_socket_interfaces(Environment{{"GLOO_SOCKET_IFNAME", "eth0,,ib0"}}),
            (std::vector<std::string>{"eth0", "ib0"}));
  EXPECT_EQ(restart_count(Environment{}), 0);
  EXPECT_EQ(restart_count(Environment{{"TORCHELASTIC_RESTART_COUNT", "2"}}), 2);
  EXPECT_THROW(restart_count(Environment{{"TORCHELASTIC_RESTART_COUNT", "two"}}), Error);
}

}  // namespace
}  // namespace lockstep
