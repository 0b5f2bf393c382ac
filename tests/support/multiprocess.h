// Multi-process tests whose worker code lives in the same test binary.
//
// A worker test is an ordinary gtest that skips unless it runs under the
// launcher; the parent test starts N copies of this binary through
// `bin/lockstep run`, each filtered to that one worker test:
//
//   LOCKSTEP_WORKER_TEST(CollectivesWorker, AllReduce) {
//     lockstep::testing::WorkerWorld world;          // init_from_env / destroy
//     auto t = torch::ones({4});
//     lockstep::world()->all_reduce(t);
//     EXPECT_TRUE(t.eq(lockstep::get_world_size()).all().item<bool>());
//   }
//
//   TEST(Collectives, AllReduce) {
//     auto result = lockstep::testing::run_workers(2, "CollectivesWorker.AllReduce");
//     EXPECT_WORKERS_OK(result);
//   }
//
// Workers see LOCKSTEP_TEST_WORKER=1 plus torchrun's variables. A failing
// assertion in any worker fails its gtest, its exit code fails the launcher,
// and the parent reports the whole prefixed output.
//
// Header-only, so that every test area can use it without build changes.
#pragma once

#include <c10/macros/Macros.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/init.h"
#include "tests/support/test_support.h"

namespace lockstep::testing {

// True inside a worker started by run_workers (or by hand with the variable).
inline bool is_worker() {
  const char* flag = std::getenv("LOCKSTEP_TEST_WORKER");
  return flag != nullptr && std::string(flag) == "1";
}

// The path of the running test binary.
inline std::string self_executable() {
  char buffer[4096];
  ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return "";
  buffer[n] = '\0';
  return buffer;
}

// The launcher: $LOCKSTEP_LAUNCHER if set (a binary with a `run` subcommand),
// else the build's bin/lockstep.
inline std::string launcher_binary() {
  const char* custom = std::getenv("LOCKSTEP_LAUNCHER");
  return custom != nullptr && *custom != '\0' ? std::string(custom) : lockstep_binary();
}

// Empty when the launcher has a working `run` subcommand, else why not.
inline std::string launcher_problem() {
  static const std::string problem = [] {
    auto result = run_command({launcher_binary(), "run", "--help"}, {}, 60);
    if (result.exit_code == 0) return std::string();
    return "`" + launcher_binary() + " run --help` failed (exit " + std::to_string(result.exit_code) +
           "): apps/lockstep/main.cpp must register lockstep::add_run_command(app). Output:\n" + result.output;
  }();
  return problem;
}

// A TCP port that was free a moment ago (for tests that need a fixed one).
inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

// Whether the file `path` exists within `seconds`: a worker's sign that it
// reached a point, for a test that must act only after it (never a fixed
// sleep: under load a worker takes any time to get there).
inline bool wait_for_file(const std::string& path, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Whether something accepts TCP connections on 127.0.0.1:port within `seconds`.
inline bool wait_for_listener(int port, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    close(fd);
    if (connected) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

struct WorkersOptions {
  std::vector<std::string> env;            // extra "NAME=value" for every worker
  std::vector<std::string> launcher_args;  // replaces "--standalone" when set
  double timeout_s = 120;
};

// Runs `test_name` ("Suite.Name") in `nproc` workers under the launcher.
inline CommandResult run_workers(int nproc, const std::string& test_name, const WorkersOptions& options = {}) {
  std::vector<std::string> argv{launcher_binary(), "run"};
  if (options.launcher_args.empty()) {
    argv.push_back("--standalone");
  } else {
    argv.insert(argv.end(), options.launcher_args.begin(), options.launcher_args.end());
  }
  argv.insert(argv.end(), {"--nproc-per-node", std::to_string(nproc), "--", self_executable(),
                           "--gtest_filter=" + test_name, "--gtest_brief=1"});
  std::vector<std::string> env{"LOCKSTEP_TEST_WORKER=1"};
  env.insert(env.end(), options.env.begin(), options.env.end());
  return run_command(argv, env, options.timeout_s);
}

inline CommandResult run_workers(int nproc, const std::string& test_name, std::vector<std::string> env) {
  WorkersOptions options;
  options.env = std::move(env);
  return run_workers(nproc, test_name, options);
}

// Initialises the process group from the launcher's environment for one
// worker test and tears it down afterwards.
class WorkerWorld {
 public:
  explicit WorkerWorld(const std::string& launcher = "pytorch") { lockstep::init_from_env(launcher); }
  ~WorkerWorld() { lockstep::destroy_process_group(); }
  C10_DISABLE_COPY_AND_ASSIGN(WorkerWorld);
};

}  // namespace lockstep::testing

// A gtest that runs only as a worker (LOCKSTEP_TEST_WORKER=1).
#define LOCKSTEP_WORKER_TEST(suite, name)                                          \
  static void lockstep_worker_body_##suite##_##name();                             \
  TEST(suite, name) {                                                              \
    if (!::lockstep::testing::is_worker()) GTEST_SKIP() << "runs as a worker only"; \
    lockstep_worker_body_##suite##_##name();                                       \
  }                                                                                \
  static void lockstep_worker_body_##suite##_##name()

// Fails (rather than skips, which would hide a broken build) when the
// launcher has no usable `run` subcommand, saying why.
#define LOCKSTEP_REQUIRE_LAUNCHER()                                                       \
  do {                                                                                    \
    std::string lockstep_problem = ::lockstep::testing::launcher_problem();               \
    ASSERT_TRUE(lockstep_problem.empty()) << lockstep_problem;                            \
  } while (false)

// Expects a run_workers result to have succeeded, printing all output if not.
#define EXPECT_WORKERS_OK(result) \
  EXPECT_EQ((result).exit_code, 0) << "worker output:\n" << (result).output

namespace lockstep::testing {

// Runs the worker tests on `nproc` ranks in ONE launch, one after another in
// each rank (gtest's filter "A:B", tests in the order they are defined), and
// expects every one to succeed; a failure names `context` and the tests, and
// the output shows which gtest failed in which rank. One launch rather than
// one per test: each process that loads libtorch costs about a CPU-second to
// start, and the world is initialised afresh by each test's WorkerWorld
// (init_from_env takes fresh store keys each time). `options.timeout_s`
// bounds each test, so the launch may take that times the number of tests.
//   expect_each_worker_ok(2, {"DdpWorker.A", "DdpWorker.B"}, options, " with find_unused_parameters");
inline void expect_each_worker_ok(int nproc, std::initializer_list<const char*> tests,
                                  const WorkersOptions& options = {}, const std::string& context = "") {
  std::string filter;
  for (const char* test : tests) filter += (filter.empty() ? "" : ":") + std::string(test);
  WorkersOptions all = options;
  all.timeout_s = options.timeout_s * static_cast<double>(tests.size());
  const CommandResult result = run_workers(nproc, filter, all);
  EXPECT_WORKERS_OK(result) << filter << context;
  // Every rank ran every test: a name the filter matches nowhere runs nothing.
  const std::string passed =
      "[  PASSED  ] " + std::to_string(tests.size()) + (tests.size() == 1 ? " test." : " tests.");
  int ranks_passed = 0;
  for (size_t at = result.output.find(passed); at != std::string::npos; at = result.output.find(passed, at + 1)) {
    ++ranks_passed;
  }
  EXPECT_EQ(ranks_passed, nproc) << "ranks that ran all " << tests.size() << " of " << filter << context
                                 << "; worker output:\n" << result.output;
}

// The same with these extra "NAME=value" variables for every worker.
inline void expect_each_worker_ok(int nproc, std::initializer_list<const char*> tests,
                                  std::vector<std::string> env, const std::string& context = "") {
  WorkersOptions options;
  options.env = std::move(env);
  expect_each_worker_ok(nproc, tests, options, context);
}

}  // namespace lockstep::testing
