// EtcdClient against a real etcd (Debian's etcd-server 3.4) on loopback:
// keys, transactions, leases, watches, endpoint failover, TLS with client
// certificates and user/password auth.
#include "lockstep/launch/etcd_client.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/support/etcd_server.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using testing::EtcdServer;

#define LOCKSTEP_REQUIRE_ETCD()                                          \
  do {                                                                   \
    const std::string lockstep_why = EtcdServer::missing();              \
    if (!lockstep_why.empty()) GTEST_SKIP() << lockstep_why;             \
  } while (false)

EtcdOptions options_for(const std::vector<std::string>& endpoints) {
  EtcdOptions o;
  o.endpoints = endpoints;
  o.request_timeout = std::chrono::seconds(3);
  return o;
}

TEST(EtcdClient, KeysTransactionsAndPrefixes) {
  LOCKSTEP_REQUIRE_ETCD();
  EtcdServer server;
  EtcdClient etcd(options_for({server.endpoint()}));
  EXPECT_FALSE(etcd.get("/t/a").has_value());
  etcd.put("/t/a", std::string("bytes\0\xff", 7));
  ASSERT_TRUE(etcd.get("/t/a").has_value());
  EXPECT_EQ(etcd.get("/t/a")->value, std::string("bytes\0\xff", 7));
  // create: only the first of two.
  EXPECT_TRUE(etcd.create("/t/b", "first"));
  EXPECT_FALSE(etcd.create("/t/b", "second"));
  EXPECT_EQ(etcd.get("/t/b")->value, "first");
  // put_if: a compare-and-swap on the modification revision.
  const int64_t seen = etcd.get("/t/b")->mod_revision;
  EXPECT_TRUE(etcd.put_if("/t/b", "swapped", seen));
  EXPECT_FALSE(etcd.put_if("/t/b", "stale", seen));
  EXPECT_EQ(etcd.get("/t/b")->value, "swapped");
  // create_all: every put or none, guarded by one key.
  EXPECT_TRUE(etcd.create_all("/t/closed", {{"/t/closed", "1"}, {"/t/open", "2"}}));
  EXPECT_FALSE(etcd.create_all("/t/closed", {{"/t/closed", "x"}, {"/t/open", "x"}}));
  EXPECT_EQ(etcd.get("/t/open")->value, "2");
  // A prefix holds exactly its keys, and creation revisions order arrivals.
  etcd.put("/tx", "not under /t/");
  int64_t revision = 0;
  auto under = etcd.get_prefix("/t/", &revision);
  ASSERT_EQ(under.size(), 4u);
  EXPECT_EQ(under[0].key, "/t/a");
  EXPECT_LT(etcd.get("/t/a")->create_revision, etcd.get("/t/b")->create_revision);
  EXPECT_GE(revision, etcd.get("/tx")->mod_revision);
  // Guarded erase: only at the revision seen.
  const int64_t at = etcd.get("/t/open")->mod_revision;
  EXPECT_FALSE(etcd.erase_prefix_if("/t/", "/t/open", at - 1));
  EXPECT_TRUE(etcd.erase_prefix_if("/t/", "/t/open", at));
  EXPECT_TRUE(etcd.get_prefix("/t/").empty());
  EXPECT_TRUE(etcd.get("/tx").has_value());
  etcd.erase("/tx");
  EXPECT_FALSE(etcd.get("/tx").has_value());
}

TEST(EtcdClient, KeysOfALeaseNotKeptAliveVanish) {
  LOCKSTEP_REQUIRE_ETCD();
  EtcdServer server;
  EtcdClient etcd(options_for({server.endpoint()}));
  const int64_t kept = etcd.grant_lease(std::chrono::seconds(2));
  const int64_t dropped = etcd.grant_lease(std::chrono::seconds(2));
  etcd.put("/n/kept", "1", kept);
  etcd.put("/n/dropped", "1", dropped);
  for (int i = 0; i < 8; ++i) {  // 4 s: twice the TTL
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_TRUE(etcd.keep_alive(kept));
  }
  EXPECT_TRUE(etcd.get("/n/kept").has_value());
  EXPECT_FALSE(etcd.get("/n/dropped").has_value());
  EXPECT_FALSE(etcd.keep_alive(dropped) && etcd.get("/n/dropped").has_value());
  etcd.revoke_lease(kept);
  EXPECT_FALSE(etcd.get("/n/kept").has_value());
}

TEST(EtcdClient, WatchWakesOnAChangeAndOtherwiseTimesOut) {
  LOCKSTEP_REQUIRE_ETCD();
  EtcdServer server;
  EtcdClient etcd(options_for({server.endpoint()}));
  int64_t revision = 0;
  etcd.get_prefix("/w/", &revision);
  // Nothing changes: the watch returns the revision it was given, after its timeout.
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(etcd.watch_prefix("/w/", revision, std::chrono::milliseconds(1500), [] { return false; }), revision);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1400));
  // Another client puts a key under the prefix (and one outside, first): the watch wakes on the first.
  std::thread writer([&] {
    EtcdClient other(options_for({server.endpoint()}));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    other.put("/elsewhere", "x");
    other.put("/w/k", "v");
  });
  start = std::chrono::steady_clock::now();
  const int64_t seen = etcd.watch_prefix("/w/", revision, std::chrono::seconds(20), [] { return false; });
  writer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(seen, etcd.get("/w/k")->mod_revision);
  // A change made before the watch started is seen too (it starts at revision + 1).
  EXPECT_EQ(etcd.watch_prefix("/w/", revision, std::chrono::seconds(5), [] { return false; }), seen);
  // `stop` ends a watch early.
  start = std::chrono::steady_clock::now();
  etcd.watch_prefix("/w/", seen, std::chrono::seconds(30), [&] {
    return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(500);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(EtcdClient, GoesOnToTheNextEndpointAndNamesEveryOneWhenNoneAnswers) {
  LOCKSTEP_REQUIRE_ETCD();
  EtcdServer server;
  const std::string dead = "127.0.0.1:" + std::to_string(EtcdServer::free_port());
  EtcdClient etcd(options_for({dead, server.endpoint()}));
  etcd.put("/f/a", "1");
  EXPECT_EQ(etcd.get("/f/a")->value, "1");
  server.kill();
  const std::string message = testing::error_of([&] { etcd.get("/f/a"); });
  EXPECT_NE(message.find("cannot reach etcd at any of its endpoints"), std::string::npos) << message;
  EXPECT_NE(message.find("http://" + dead), std::string::npos) << message;
  EXPECT_NE(message.find(server.url()), std::string::npos) << message;
}

class EtcdTls : public ::testing::Test {
 protected:
  void SetUp() override {
    LOCKSTEP_REQUIRE_ETCD();
    char pattern[] = "/tmp/lockstep_certs_XXXXXX";
    certs_ = mkdtemp(pattern);
    const std::string script = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/support/make_test_certs.sh";
    ASSERT_EQ(std::system((script + " " + certs_ + " 127.0.0.1").c_str()), 0) << "openssl failed";
  }
  void TearDown() override {
    if (!certs_.empty()) std::filesystem::remove_all(certs_);
  }
  EtcdOptions tls_options(const EtcdServer& server, const std::string& who) const {
    EtcdOptions o = options_for({server.endpoint()});
    o.protocol = "https";
    o.ca_file = certs_ + "/ca.pem";
    if (!who.empty()) {
      o.cert_file = certs_ + "/" + who + ".pem";
      o.key_file = certs_ + "/" + who + ".key";
    }
    return o;
  }
  std::string certs_;
};

TEST_F(EtcdTls, ClientCertificateFromTheClustersCaIsLetInAnyOtherIsNot) {
  EtcdServer server(EtcdServer::Tls{certs_ + "/ca.pem", certs_ + "/server.pem", certs_ + "/server.key"});
  EtcdClient client(tls_options(server, "client"));
  client.put("/s/a", "1");
  EXPECT_EQ(client.get("/s/a")->value, "1");
  for (const std::string who : {"stranger", ""}) {
    EtcdClient refused(tls_options(server, who));
    const std::string message = testing::error_of([&] { refused.get("/s/a"); });
    EXPECT_NE(message.find("cannot reach etcd at any of its endpoints: " + server.url()), std::string::npos)
        << who << ": " << message;
    EXPECT_NE(message.find(who.empty() ? "give one: --rdzv-conf cert=FILE,key=FILE"
                                       : "is this client's certificate (" + certs_ + "/stranger.pem) signed by a CA"),
              std::string::npos)
        << who << ": " << message;
  }
  // Plain http to an https member is not an answer either.
  EtcdClient plain(options_for({server.endpoint()}));
  EXPECT_NE(testing::error_of([&] { plain.get("/s/a"); }), "");
}

TEST(EtcdAuth, UserAndPasswordGetAToken) {
  LOCKSTEP_REQUIRE_ETCD();
  EtcdServer server;
  ASSERT_TRUE(server.etcdctl("user add root --new-user-password=rootpw >/dev/null"));
  ASSERT_TRUE(server.etcdctl("user grant-role root root >/dev/null"));
  ASSERT_TRUE(server.etcdctl("user add trainer --new-user-password=s3cret >/dev/null"));
  ASSERT_TRUE(server.etcdctl("role add lockstep >/dev/null"));
  ASSERT_TRUE(server.etcdctl("role grant-permission lockstep --prefix=true readwrite /lockstep/ >/dev/null"));
  ASSERT_TRUE(server.etcdctl("user grant-role trainer lockstep >/dev/null"));
  ASSERT_TRUE(server.etcdctl("auth enable >/dev/null"));
  EtcdOptions o = options_for({server.endpoint()});
  o.user = "trainer";
  o.password = "s3cret";
  EtcdClient trainer(o);
  trainer.put("/lockstep/x", "1");
  EXPECT_EQ(trainer.get("/lockstep/x")->value, "1");
  // Outside its role's keys: refused, with etcd's reason.
  std::string message = testing::error_of([&] { trainer.put("/other", "1"); });
  EXPECT_NE(message.find("permission denied"), std::string::npos) << message;
  o.password = "wrong";
  EtcdClient wrong(o);
  message = testing::error_of([&] { wrong.get("/lockstep/x"); });
  EXPECT_NE(message.find("refused user 'trainer'"), std::string::npos) << message;
  // Without credentials: refused, not hung.
  EtcdClient anonymous(options_for({server.endpoint()}));
  EXPECT_NE(testing::error_of([&] { anonymous.put("/lockstep/y", "1"); }), "");
}

}  // namespace
}  // namespace lockstep
