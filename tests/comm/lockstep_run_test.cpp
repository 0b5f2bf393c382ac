// `lockstep run` end to end: the worker environment, output prefixes, a
// failing worker, a stopped worker, restarts, signal forwarding, a world that
// never fills up, two launchers as two machines, an elastic job that grows,
// and Debian's torchrun
// launching a lockstep program.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "tests/comm/dist_test_util.h"

namespace lockstep {
namespace {

std::string env_or(const char* name, const std::string& fallback = "<unset>") {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

LOCKSTEP_WORKER_TEST(LauncherWorker, PrintsEnvironment) {
  for (const char* name : {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                           "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                           "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS"}) {
    std::cout << name << "=" << env_or(name) << "\n";
  }
  std::cout << "RUN_ID_SET=" << !env_or("TORCHELASTIC_RUN_ID", "").empty() << "\n";
  std::cerr << "on stderr\n";
  std::cout << "no newline at the end" << std::flush;
  std::_Exit(0);  // so that nothing (gtest's summary) follows the unterminated line
}

TEST(Launcher, SetsTorchrunEnvironmentAndPrefixesLines) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto options = testing::worker_options();
  options.launcher_args = {"--standalone", "--max-restarts", "2", "--run-id", "job7"};
  auto result = testing::run_workers(2, "LauncherWorker.PrintsEnvironment", options);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (int r = 0; r < 2; ++r) {
    std::string p = "[rank" + std::to_string(r) + "]: ";
    for (const std::string& line : std::vector<std::string>{
             "RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r), "GROUP_RANK=0",
          "ROLE_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
          std::string("TORCHELASTIC_RESTART_COUNT=0"), std::string("TORCHELASTIC_MAX_RESTARTS=2"),
          std::string("TORCHELASTIC_USE_AGENT_STORE=True"), std::string("OMP_NUM_THREADS=1"),
          std::string("RUN_ID_SET=1"), std::string("no newline at the end"), std::string("on stderr")}) {
      EXPECT_TRUE(contains(result.output, p + line + "\n")) << p + line << "\n" << result.output;
    }
  }
  // A user's OMP_NUM_THREADS is left alone.
  options.env.push_back("OMP_NUM_THREADS=3");
  result = testing::run_workers(2, "LauncherWorker.PrintsEnvironment", options);
  EXPECT_TRUE(contains(result.output, "[rank1]: OMP_NUM_THREADS=3\n")) << result.output;
}

LOCKSTEP_WORKER_TEST(LauncherWorker, OneExitsWithThree) {
  if (env_or("RANK") == "1") {
    std::cout << "rank 1 leaving with code 3" << std::endl;
    std::_Exit(3);
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
  std::cout << "rank 0 finished sleeping" << std::endl;
}

TEST(Launcher, FailingWorkerStopsTheOthersAndSetsTheExitCode) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto options = testing::worker_options();
  options.timeout_s = 30;  // well below rank 0's 60 s sleep
  auto result = testing::run_workers(2, "LauncherWorker.OneExitsWithThree", options);
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_TRUE(contains(result.output, "worker rank 1")) << result.output;
  EXPECT_TRUE(contains(result.output, "exited with code 3")) << result.output;
  EXPECT_FALSE(contains(result.output, "finished sleeping")) << result.output;
}

// A worker that fails the moment it starts gets its peers SIGTERMed while
// they may still be between fork and exec, running the launcher's own signal
// handler: that once wrote into the launcher's signal pipe, so the launcher
// took the peer's SIGTERM for its own ("received Terminated", no restart;
// tests/multinode peerfail caught it, about every second run).
TEST(Launcher, APeerStoppedRightAfterForkIsNotTheLaunchersSignal) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  for (int attempt = 0; attempt < 15; ++attempt) {
    auto result = testing::run_command({testing::lockstep_binary(), "run", "--standalone", "--nproc-per-node", "4",
                                        "--", "bash", "-c", "[ $RANK = 0 ] && exit 3; sleep 30"},
                                       {}, 60);
    ASSERT_EQ(result.exit_code, 3) << "attempt " << attempt << ":\n" << result.output;
    ASSERT_FALSE(contains(result.output, "received Terminated")) << "attempt " << attempt << ":\n" << result.output;
  }
}

LOCKSTEP_WORKER_TEST(LauncherWorker, PeerStops) {
  testing::WorkerWorld session;
  auto world = lockstep::world();
  world->barrier();
  if (world->rank() == 1) raise(SIGSTOP);
  auto t = torch::ones({8});
  world->all_reduce(t);  // rank 0: throws TimeoutError, failing this test and the job
}

TEST(Launcher, StoppedPeerMakesTheOthersTimeOut) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto options = testing::worker_options({"LOCKSTEP_TIMEOUT_S=3"});
  options.timeout_s = 60;
  auto result = testing::run_workers(2, "LauncherWorker.PeerStops", options);
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.exit_code, 124) << "the launcher hung:\n" << result.output;
  EXPECT_TRUE(contains(result.output, "rank 0: all_reduce #")) << result.output;
  EXPECT_TRUE(contains(result.output, "on group 'world' (2 ranks) timed out after 3s waiting for ranks [1]"))
      << result.output;
}

LOCKSTEP_WORKER_TEST(LauncherWorker, FailsOnFirstAttempt) {
  testing::WorkerWorld session;
  auto t = torch::full({2}, get_rank() + 1.0);
  lockstep::world()->all_reduce(t);  // the store and rendezvous work in every attempt
  EXPECT_TRUE(testing::tensors_equal(t, torch::full({2}, 3.0)));
  const std::string attempt = env_or("TORCHELASTIC_RESTART_COUNT");
  if (get_rank() == 1 && attempt == "0") {
    std::cout << "rank 1 fails attempt 0" << std::endl;
    std::_Exit(5);
  }
  std::cout << "attempt " << attempt << " ok" << std::endl;
  // Rank 0 of attempt 0 is stopped by the launcher before it gets further.
  if (attempt == "0") std::this_thread::sleep_for(std::chrono::seconds(60));
}

TEST(Launcher, MaxRestartsRestartsAllWorkers) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto options = testing::worker_options();
  options.timeout_s = 60;
  options.launcher_args = {"--standalone", "--max-restarts", "1"};
  auto result = testing::run_workers(2, "LauncherWorker.FailsOnFirstAttempt", options);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "restarting all workers (restart 1 of 1)")) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank0]: attempt 1 ok")) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank1]: attempt 1 ok")) << result.output;

  options.launcher_args = {"--standalone"};
  result = testing::run_workers(2, "LauncherWorker.FailsOnFirstAttempt", options);
  EXPECT_EQ(result.exit_code, 5) << result.output;
  EXPECT_FALSE(contains(result.output, "attempt 1 ok")) << result.output;
}

std::atomic<bool> g_terminated{false};

LOCKSTEP_WORKER_TEST(LauncherWorker, WaitsForSigterm) {
  signal(SIGTERM, [](int) { g_terminated = true; });
  {
    testing::WorkerWorld session;
    synchronize();  // both handlers are installed before anyone signals
  }
  if (env_or("RANK") == "0") kill(getppid(), SIGTERM);  // the launcher
  for (int i = 0; i < 600 && !g_terminated; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::cout << "rank " << env_or("RANK") << (g_terminated ? " got SIGTERM" : " never got SIGTERM") << std::endl;
}

TEST(Launcher, ForwardsSigtermToWorkers) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto options = testing::worker_options();
  options.timeout_s = 60;
  auto result = testing::run_workers(2, "LauncherWorker.WaitsForSigterm", options);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank0]: rank 0 got SIGTERM")) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank1]: rank 1 got SIGTERM")) << result.output;
}

LOCKSTEP_WORKER_TEST(RendezvousWorker, ShortWorld) {
  auto message = testing::error_of([] { init_from_env("pytorch"); });
  std::cout << "error: " << message << std::endl;
}

TEST(Rendezvous, WorldThatNeverFillsUpFailsNamingTheMissingRanks) {
  // One process told the world has three ranks: no launcher, no peers.
  int port = testing::free_port();
  auto result = testing::run_command(
      {testing::self_executable(), "--gtest_filter=RendezvousWorker.ShortWorld"},
      {"LOCKSTEP_TEST_WORKER=1", "RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=3", "MASTER_ADDR=127.0.0.1",
       "MASTER_PORT=" + std::to_string(port), "LOCKSTEP_TIMEOUT_S=2"},
      60);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "error: rank 0: rendezvous of group 'world' timed out after 2s: 1 of 3 ranks "
                                      "arrived; missing ranks [1, 2]; check that the world size (3) matches"))
      << result.output;
}

LOCKSTEP_WORKER_TEST(LocalGroupWorker, SplitsByNode) {
  testing::WorkerWorld session;
  const int node = std::stoi(env_or("GROUP_RANK"));
  auto local = local_group();
  EXPECT_EQ(get_world_size(), 4);
  EXPECT_EQ(local->size(), 2);
  EXPECT_EQ(local->rank(), std::stoi(env_or("LOCAL_RANK")));
  EXPECT_EQ(get_local_rank(), local->rank());
  EXPECT_EQ(local->global_ranks(), (std::vector<int>{2 * node, 2 * node + 1}));
  auto t = torch::full({1}, static_cast<double>(get_rank()));
  local->all_reduce(t);
  EXPECT_TRUE(testing::tensors_equal(t, torch::full({1}, 4.0 * node + 1)));
  lockstep::world()->all_reduce(t);
  EXPECT_TRUE(testing::tensors_equal(t, torch::full({1}, 12.0)));  // 1 + 1 + 5 + 5
}

TEST(Launcher, TwoLaunchersActAsTwoMachines) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  const std::string port = std::to_string(testing::free_port());
  testing::CommandResult results[2];
  std::vector<std::thread> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.emplace_back([&, node] {
      auto options = testing::worker_options();
      options.launcher_args = {"--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr", "127.0.0.1",
                               "--master-port", port};
      results[node] = testing::run_workers(2, "LocalGroupWorker.SplitsByNode", options);
    });
  }
  for (auto& t : nodes) t.join();
  EXPECT_WORKERS_OK(results[0]);
  EXPECT_WORKERS_OK(results[1]);
  EXPECT_TRUE(contains(results[1].output, "[rank3]:")) << results[1].output;
}

// Round 0 of an elastic job (one node) waits to be stopped for the next
// round; later rounds count the world and end. In round 0, rank 1 creates the
// file ELASTIC_ROUND0_MARK names (when set) once it said it runs.
LOCKSTEP_WORKER_TEST(ElasticWorker, WaitsForTheSecondNode) {
  if (env_or("LOCKSTEP_RDZV_ROUND") == "0") {
    std::cout << "round 0 running" << std::endl;
    const std::string mark = env_or("ELASTIC_ROUND0_MARK");
    if (!mark.empty() && env_or("RANK") == "1") std::ofstream(mark) << "running\n";
    std::this_thread::sleep_for(std::chrono::seconds(100));
    std::cout << "round 0 was never stopped" << std::endl;
    std::_Exit(5);
  }
  testing::WorkerWorld session;
  auto t = torch::full({1}, static_cast<double>(get_rank()));
  lockstep::world()->all_reduce(t);
  std::cout << "round " << env_or("LOCKSTEP_RDZV_ROUND") << " node " << env_or("GROUP_RANK") << " restarts "
            << env_or("TORCHELASTIC_RESTART_COUNT") << ": world " << get_world_size() << ", ranks sum to "
            << t.item<double>() << std::endl;
}

TEST(Launcher, ElasticJobTakesANodeThatJoinsLater) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  const std::string port = std::to_string(testing::free_port());
  testing::TempDir dir;
  const std::string round0_running = dir.file("round0_running");
  auto launch = [&](testing::CommandResult* result, std::vector<std::string> env) {
    auto options = testing::worker_options();
    options.launcher_args = {"--nnodes", "1:2", "--master-addr", "127.0.0.1", "--master-port", port,
                             "--rdzv-conf", "last_call_timeout=1", "--max-restarts", "0"};
    options.env.insert(options.env.end(), env.begin(), env.end());
    *result = testing::run_workers(2, "ElasticWorker.WaitsForTheSecondNode", options);
  };
  testing::CommandResult first, second;
  std::thread first_node(launch, &first, std::vector<std::string>{"ELASTIC_ROUND0_MARK=" + round0_running});
  // The second node arrives once round 0 (the first node alone) runs: when
  // its rank 1 says so, however long a loaded machine took to get there.
  const bool round0_ran = testing::wait_for_file(round0_running, 90);
  std::thread second_node(launch, &second, std::vector<std::string>{});
  EXPECT_TRUE(round0_ran) << "round 0 did not start within 90 s";
  first_node.join();
  second_node.join();
  EXPECT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(second.exit_code, 0) << second.output;
  EXPECT_TRUE(contains(first.output, "rendezvous round 0: node 0 of 1 (ranks 0..1 of 2")) << first.output;
  EXPECT_TRUE(contains(first.output, "[rank1]: round 0 running")) << first.output;
  EXPECT_TRUE(contains(first.output, "a new rendezvous round is starting (1 node asked to join); stopping this "
                                     "node's workers")) << first.output;
  // The node that ran keeps rank 0; the newcomer follows. Growing is not a restart.
  EXPECT_TRUE(contains(first.output, "rendezvous round 1: node 0 of 2 (ranks 0..1 of 4")) << first.output;
  EXPECT_TRUE(contains(second.output, "rendezvous round 1: node 1 of 2 (ranks 2..3 of 4")) << second.output;
  EXPECT_TRUE(contains(first.output, "[rank1]: round 1 node 0 restarts 0: world 4, ranks sum to 6")) << first.output;
  EXPECT_TRUE(contains(second.output, "[rank3]: round 1 node 1 restarts 0: world 4, ranks sum to 6"))
      << second.output;
}

TEST(Launcher, ElasticJobBelowItsMinimumFailsNamingIt) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  auto options = testing::worker_options();
  options.launcher_args = {"--nnodes", "2:3", "--master-addr", "127.0.0.1", "--master-port",
                           std::to_string(testing::free_port()), "--join-timeout", "2"};
  auto result = testing::run_workers(1, "ElasticWorker.WaitsForTheSecondNode", options);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(contains(result.output, "no rendezvous round admitted this node (2 to 3 nodes; round 0) within 2 s "
                                      "(--join-timeout)")) << result.output;
}

LOCKSTEP_WORKER_TEST(TorchrunWorker, Collectives) {
  std::cout << "agent store: " << env_or("TORCHELASTIC_USE_AGENT_STORE") << std::endl;
  testing::WorkerWorld session;
  auto t = torch::full({3}, get_rank() + 1.0);
  lockstep::world()->all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(testing::tensors_equal(t, torch::full({3}, 3.0)));
  auto words = all_gather_object(std::to_string(get_rank()));
  EXPECT_EQ(words, (std::vector<std::string>{"0", "1"}));
  std::cout << "torchrun worker " << get_rank() << " ok" << std::endl;
}

int python_torch_major() {
  static const int major = [] {
    auto result = testing::run_command({testing::python(), "-c", "import torch; print(torch.__version__.split('.')[0])"},
                                       {}, 120);
    return result.exit_code == 0 ? std::atoi(result.output.c_str()) : 0;
  }();
  return major;
}

testing::CommandResult run_torchrun(const std::vector<std::string>& rendezvous_args) {
  std::vector<std::string> argv = testing::torchrun();
  argv.push_back("--no_python");
  argv.insert(argv.end(), rendezvous_args.begin(), rendezvous_args.end());
  argv.insert(argv.end(), {"--nproc_per_node", "2", testing::self_executable(),
                           "--gtest_filter=TorchrunWorker.Collectives"});
  return testing::run_command(argv, {"LOCKSTEP_TEST_WORKER=1", "LOCKSTEP_TIMEOUT_S=60"}, 180);
}

TEST(Torchrun, LaunchesALockstepProgram) {
  if (!testing::python_has("torch")) GTEST_SKIP() << "/usr/bin/python3 has no torch (python3-torch is not installed)";
  auto result = run_torchrun({"--standalone"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // torch 1.13's standalone rendezvous leaves the store to rank 0 (2.x shares its agent's).
  if (python_torch_major() == 1) EXPECT_TRUE(contains(result.output, "agent store: False")) << result.output;
  EXPECT_TRUE(contains(result.output, "torchrun worker 1 ok")) << result.output;
}

TEST(Torchrun, AgentStorePath) {
  if (!testing::python_has("torch")) GTEST_SKIP() << "/usr/bin/python3 has no torch (python3-torch is not installed)";
  // Without --standalone torchrun uses the static rendezvous: its agent hosts
  // the store and the workers connect to it as clients.
  auto result = run_torchrun({"--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port",
                              std::to_string(testing::free_port())});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "agent store: True")) << result.output;
  EXPECT_TRUE(contains(result.output, "torchrun worker 1 ok")) << result.output;
}

}  // namespace
}  // namespace lockstep
