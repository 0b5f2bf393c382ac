#include "lockstep/launch/launcher.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/launch/line_prefixer.h"
#include "lockstep/launch/rendezvous_args.h"
#include "lockstep/launch/internal/restart_policy.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using testing::error_of;

// Expects each "NAME=value" of `expected` among a worker's variables.
void expect_vars(const std::map<std::string, std::string>& env, const std::vector<std::string>& expected) {
  for (const std::string& assignment : expected) {
    const std::string name = assignment.substr(0, assignment.find('='));
    auto found = env.find(name);
    EXPECT_EQ(found == env.end() ? name + " unset" : name + "=" + found->second, assignment);
  }
}

TEST(WorkerEnv, MatchesTorchrunForEachWorker) {
  auto options = LaunchOptions().nproc_per_node(4).nnodes(3).node_rank(2).master_addr("head").max_restarts(5);
  Environment base{{"PATH", "/bin"}, {"RANK", "99"}};
  auto env = build_worker_env(options, /*local_rank=*/1, /*restart_count=*/2, /*master_port=*/1234, "run9", base);
  // RANK 9: node 2 * 4 + 1, overriding the launcher's own RANK.
  expect_vars(env, {"PATH=/bin", "LOCAL_RANK=1", "RANK=9", "GROUP_RANK=2", "ROLE_RANK=9", "LOCAL_WORLD_SIZE=4",
                    "WORLD_SIZE=12", "GROUP_WORLD_SIZE=3", "MASTER_ADDR=head", "MASTER_PORT=1234",
                    "TORCHELASTIC_RESTART_COUNT=2", "TORCHELASTIC_MAX_RESTARTS=5", "TORCHELASTIC_RUN_ID=run9",
                    "TORCHELASTIC_USE_AGENT_STORE=True", "OMP_NUM_THREADS=1"});
}

TEST(WorkerEnv, StandaloneIsOneLoopbackNode) {
  auto options = LaunchOptions().nproc_per_node(2).nnodes(5).node_rank(3).master_addr("elsewhere").standalone(true);
  auto env = build_worker_env(options, 1, 0, 4321, "r", {});
  expect_vars(env, {"RANK=1", "WORLD_SIZE=2", "GROUP_RANK=0", "MASTER_ADDR=127.0.0.1"});
}

TEST(WorkerEnv, OmpThreadsOnlyWhenUnsetAndShared) {
  auto two = LaunchOptions().nproc_per_node(2);
  EXPECT_EQ(build_worker_env(two, 0, 0, 1, "r", {{"OMP_NUM_THREADS", "4"}})["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(build_worker_env(LaunchOptions().nproc_per_node(1), 0, 0, 1, "r", {}).count("OMP_NUM_THREADS"), 0u);
}

TEST(WorkerEnv, SocketInterfaceOnlyWhenNamed) {
  auto named = LaunchOptions().nproc_per_node(1).socket_ifname("eth1,eth2");
  EXPECT_EQ(build_worker_env(named, 0, 0, 1, "r", {{"GLOO_SOCKET_IFNAME", "lo"}})["GLOO_SOCKET_IFNAME"], "eth1,eth2");
  EXPECT_EQ(build_worker_env(LaunchOptions(), 0, 0, 1, "r", {{"GLOO_SOCKET_IFNAME", "lo"}})["GLOO_SOCKET_IFNAME"], "lo");
  EXPECT_EQ(build_worker_env(LaunchOptions(), 0, 0, 1, "r", {}).count("GLOO_SOCKET_IFNAME"), 0u);
}

TEST(RestartPolicy, AFixedJobRestartsInPlaceAndEveryRestartCounts) {
  const auto options = LaunchOptions().nproc_per_node(2).nnodes(1).max_restarts(3).command({"true"});
  auto policy = make_restart_policy(options, /*master_port=*/1234, "run", "", /*hosts_store=*/true);
  const auto never = [] { return false; };
  std::optional<NodePlacement> first = policy->next_start(nullptr, false, never);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->restart_count, 0);
  EXPECT_EQ(first->round, -1);  // not elastic
  policy->watch(*first);
  EXPECT_EQ(policy->stop_reason(), "");  // one node: nobody else restarts it
  EXPECT_TRUE(policy->counts_as_restart(true));
  EXPECT_TRUE(policy->counts_as_restart(false));
  std::optional<NodePlacement> second = policy->next_start(&*first, true, never);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->restart_count, 1);
  EXPECT_EQ(second->node_rank, 0);
  EXPECT_EQ(second->nnodes, 1);
}

TEST(LaunchOptionsCheck, NamesTheBadOption) {
  EXPECT_NE(error_of([] { validate_launch_options(LaunchOptions()); }).find("no command given"), std::string::npos);
  auto with_command = [] { return LaunchOptions().command({"true"}); };
  EXPECT_NE(error_of([&] { validate_launch_options(with_command().nproc_per_node(0)); }).find("--nproc-per-node"),
            std::string::npos);
  EXPECT_NE(error_of([&] { validate_launch_options(with_command().nnodes(2).node_rank(2)); }).find("--node-rank 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { validate_launch_options(with_command().master_port(0)); }).find("--master-port 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { validate_launch_options(with_command().max_restarts(-1)); }).find("--max-restarts"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { validate_launch_options(with_command().standalone(true).master_port(0)); }), "<no error>");
}

TEST(RendezvousArgs, TorchrunsElasticArguments) {
  LaunchOptions options;
  apply_nnodes("3", options);
  EXPECT_EQ(options.nnodes(), 3);
  EXPECT_FALSE(options.elastic());
  apply_nnodes("2:4", options);
  EXPECT_EQ(options.min_nodes(), 2);
  EXPECT_EQ(options.nnodes(), 4);
  EXPECT_TRUE(options.elastic());
  EXPECT_FALSE(LaunchOptions(options).standalone(true).elastic());
  EXPECT_NE(error_of([&] { apply_nnodes("3:2", options); }).find("--nnodes 3:2: needs 1 <= MIN <= MAX"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_nnodes("two", options); }).find("--nnodes: 'two' is not a number"), std::string::npos);
  apply_rdzv_endpoint("10.0.0.7:29411", options);
  EXPECT_EQ(options.master_addr(), "10.0.0.7");
  EXPECT_EQ(options.master_port(), 29411);
  apply_rdzv_endpoint("node-a", options);
  EXPECT_EQ(options.master_addr(), "node-a");
  EXPECT_EQ(options.master_port(), 29400);
  apply_rdzv_conf("last_call_timeout=5,join_timeout=120", options);
  EXPECT_EQ(options.last_call_timeout(), 5);
  EXPECT_EQ(options.join_timeout(), 120);
  EXPECT_NE(error_of([&] { apply_rdzv_conf("read_timeout=5", options); }).find("unknown key 'read_timeout'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_rdzv_conf("last_call_timeout", options); }).find("is not KEY=VALUE"),
            std::string::npos);
}

TEST(RendezvousArgs, EtcdEndpointsAndSettings) {
  LaunchOptions options;
  apply_rdzv_endpoint("h1:2379,h2:2379,https://h3:2379", options);
  EXPECT_EQ(options.etcd().endpoints, (std::vector<std::string>{"h1:2379", "h2:2379", "https://h3:2379"}));
  apply_rdzv_endpoint("h1:2379", options);
  EXPECT_EQ(options.etcd().endpoints, std::vector<std::string>{"h1:2379"});
  EXPECT_EQ(options.master_addr(), "h1");  // one endpoint also serves the c10d backend
  apply_rdzv_conf("protocol=https,cacert=ca.pem,cert=node.pem,key=node.key,user=trainer,lease_ttl=6,"
                  "last_call_timeout=2", options);
  EXPECT_EQ(options.etcd().protocol, "https");
  EXPECT_EQ(options.etcd().ca_file, "ca.pem");
  EXPECT_EQ(options.etcd().cert_file, "node.pem");
  EXPECT_EQ(options.etcd().key_file, "node.key");
  EXPECT_EQ(options.etcd().user, "trainer");
  EXPECT_EQ(options.lease_ttl(), 6);
  EXPECT_EQ(options.last_call_timeout(), 2);
  EXPECT_NE(error_of([&] { apply_rdzv_conf("protocol=ftp", options); }).find("protocol=ftp: http or https"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_rdzv_endpoint(",", options); }).find("no endpoint in ','"), std::string::npos);
  EXPECT_NE(error_of([&] { validate_launch_options(LaunchOptions().command({"x"}).rdzv_backend("zookeeper")); })
                .find("--rdzv-backend 'zookeeper' is none of c10d, static and etcd"),
            std::string::npos);
}

TEST(WorkerEnv, AnEtcdRoundsWorkersMeetAtItsNodeZero) {
  NodePlacement placement;
  placement.node_rank = 1;
  placement.nnodes = 2;
  placement.round = 3;
  placement.master_addr = "10.0.0.9";
  placement.master_port = 41234;
  auto env = build_worker_env(LaunchOptions().min_nodes(2).nnodes(3).master_addr("unused"), placement, 0, 29500, "r",
                              {});
  expect_vars(env, {"MASTER_ADDR=10.0.0.9", "MASTER_PORT=41234", "RANK=1"});
}

TEST(WorkerEnv, AnElasticRoundPlacesTheNodeAndNamesTheRound) {
  NodePlacement placement;
  placement.node_rank = 1;
  placement.nnodes = 3;
  placement.restart_count = 1;
  placement.round = 4;
  auto env = build_worker_env(LaunchOptions().nproc_per_node(2).min_nodes(2).nnodes(4), placement, 1, 29500, "r",
                              {{"LOCKSTEP_RDZV_ROUND", "stale"}});
  expect_vars(env, {"RANK=3", "WORLD_SIZE=6", "GROUP_RANK=1", "GROUP_WORLD_SIZE=3", "TORCHELASTIC_RESTART_COUNT=1",
                    "LOCKSTEP_RDZV_ROUND=4"});
  // A fixed job's workers do not inherit a round from an elastic launcher above them.
  EXPECT_EQ(build_worker_env(LaunchOptions(), 0, 0, 1, "r", {{"LOCKSTEP_RDZV_ROUND", "2"}}).count("LOCKSTEP_RDZV_ROUND"),
            0u);
}

TEST(LinePrefixer, PrefixesWholeLinesAcrossChunks) {
  std::vector<std::string> lines;
  LinePrefixer prefixer("[rank3]: ", [&](const std::string& line) { lines.push_back(line); });
  std::string text = "alpha\nbe";
  prefixer.feed(text.data(), text.size());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank3]: alpha\n"}));
  text = "ta\n\ngam";
  prefixer.feed(text.data(), text.size());
  prefixer.flush();
  prefixer.flush();
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank3]: alpha\n", "[rank3]: beta\n", "[rank3]: \n", "[rank3]: gam\n"}));
}

TEST(LinePrefixer, SplitsEndlessLines) {
  std::vector<std::string> lines;
  LinePrefixer prefixer("> ", [&](const std::string& line) { lines.push_back(line); });
  std::string chunk(40 * 1024, 'x');
  prefixer.feed(chunk.data(), chunk.size());
  EXPECT_TRUE(lines.empty());
  prefixer.feed(chunk.data(), chunk.size());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].size(), 2 + 80 * 1024 + 1);
}

}  // namespace
}  // namespace lockstep
