// Unit tests of the Gloo bind-address choice (lockstep/dist/network.h). The
// multi-host behaviour itself is tested across network namespaces by
// tests/multinode/multinode_test.sh.
#include <gtest/gtest.h>

#include <cstdlib>

#include "lockstep/dist/network.h"

namespace lockstep {
namespace {

// Sets an environment variable for one test and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

TEST(Network, LoopbackIsReachedFromLoopback) {
  EXPECT_EQ(local_address_towards("127.0.0.1", 29500), "127.0.0.1");
  const std::string local = local_address_towards("localhost", 29500);
  EXPECT_TRUE(local.rfind("127.", 0) == 0 || local == "::1") << local;
}

TEST(Network, UnknownHostHasNoAddress) {
  EXPECT_EQ(local_address_towards("no-such-host.invalid", 29500), "");
}

TEST(Network, BindAddressFollowsTheRules) {
  ScopedEnv unset("GLOO_SOCKET_IFNAME", nullptr);
  EXPECT_EQ(gloo_bind_address("127.0.0.1", 29500, 4), "127.0.0.1");
  EXPECT_EQ(gloo_bind_address("localhost", 29500, 4), "127.0.0.1");
  EXPECT_EQ(gloo_bind_address("some.other.host.invalid", 29500, 1), "127.0.0.1");
  // Not resolvable: left to Gloo's default, which then reports its own error.
  EXPECT_EQ(gloo_bind_address("some.other.host.invalid", 29500, 4), "");
  ScopedEnv named("GLOO_SOCKET_IFNAME", "lo");
  EXPECT_EQ(gloo_bind_address("127.0.0.1", 29500, 4), "");
}

}  // namespace
}  // namespace lockstep
