// Unit tests of the Gloo bind-address choice (lockstep/dist/network.h). The
// multi-host behaviour itself is tested across network namespaces by
// tests/multinode/multinode_test.sh.
#include <gtest/gtest.h>

#include "lockstep/core/error.h"
#include "lockstep/dist/env.h"
#include "lockstep/dist/network.h"

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
