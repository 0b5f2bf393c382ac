#include "lockstep/launch/restart_rounds.h"

#include <gtest/gtest.h>

#include <future>

#include "lockstep/compat/c10d.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;

// Node 0's store, as the launcher on node 0 hosts it.
struct StoreServer {
  StoreServer() {
    compat::TcpStoreSpec spec;
    spec.host = "127.0.0.1";
    spec.is_server = true;
    std::tie(store, port) = compat::make_tcp_store(spec);
  }
  c10::intrusive_ptr<compat::C10dStore> store;
  int port = 0;
};

bool never() { return false; }

TEST(RestartRounds, WatcherSeesAnotherNodeEnterTheNextRound) {
  StoreServer server;
  RestartRounds node0("127.0.0.1", server.port, 2, 0, 20s);
  RestartRounds node1("127.0.0.1", server.port, 2, 1, 20s);
  node0.watch(0);
  node1.watch(0);
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(node0.node_waiting(), -1);  // nobody has moved on yet

  auto entered = std::async(std::launch::async, [&] { return node1.enter(1, never); });
  for (int i = 0; i < 100 && node0.node_waiting() < 0; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(node0.node_waiting(), 1);
  EXPECT_EQ(node1.node_waiting(), -1);  // a node does not see itself
  EXPECT_EQ(entered.wait_for(300ms), std::future_status::timeout);  // node 1 waits for node 0
  EXPECT_TRUE(node0.enter(1, never));
  EXPECT_TRUE(entered.get());

  node0.watch(1);  // a new round: the flag starts clear
  EXPECT_EQ(node0.node_waiting(), -1);
}

TEST(RestartRounds, MissingNodeTimesOutNamingIt) {
  StoreServer server;
  RestartRounds node0("127.0.0.1", server.port, 3, 0, 1500ms);
  RestartRounds node2("127.0.0.1", server.port, 3, 2, 1500ms);
  auto late = std::async(std::launch::async, [&] { return node2.enter(1, never); });
  try {
    node0.enter(1, never);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("node 0: restart 1: nodes [1] did not join it within 1.5 s"),
              std::string::npos)
        << error.what();
  }
  EXPECT_THROW(late.get(), Error);
}

TEST(RestartRounds, UnreachableStoreIsReportedAndInterruptionEndsTheWait) {
  int closed_port = 0;
  {
    StoreServer gone;
    closed_port = gone.port;
  }
  RestartRounds lonely("127.0.0.1", closed_port, 2, 1, 1500ms);
  try {
    lonely.enter(1, never);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("node 0's store at 127.0.0.1:" + std::to_string(closed_port) +
                                             " is unreachable"),
              std::string::npos)
        << error.what();
  }
  // Asked after the first failed attempt (libtorch 2.x's own connect retries
  // make one attempt take about 3 s here), well before this deadline.
  RestartRounds patient("127.0.0.1", closed_port, 2, 1, 8s);
  int asked = 0;
  EXPECT_FALSE(patient.enter(1, [&] { return ++asked >= 1; }));
  EXPECT_EQ(asked, 1);
}

}  // namespace
}  // namespace lockstep
