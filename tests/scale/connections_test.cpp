// How many TCP connections and listening ports a rank of a whole DDP job
// holds (Note [One mesh per process] in lockstep/comm/process_group.h).
//
// A full Gloo mesh costs each rank one connection per peer, and on Gloo 1.13
// one listening port per peer too. The test trains a DDP job through
// `lockstep train --nproc N`, with logging (the metrics writer gathers from
// its own thread) and evaluation (the evaluation records' gather), and while
// it trains it reads each worker's sockets from /proc: the socket inodes of
// /proc/PID/fd, looked up in /proc/PID/net/tcp and tcp6 (state 0A listens,
// 01 is connected). The most each rank held at any sample must stay within
// N + 8: one mesh and a few more (the store, the launcher). Two meshes
// would need 2 (N - 1).
//
// Each rank also logs how many operations it made on the job's store to set
// up its world group ("world group ready after K store operations"): the
// rendezvous and Gloo's address exchange (Note [One table of Gloo addresses]).
// Every rank but rank 0 makes the same few at 8 and at 64 ranks; rank 0
// reads each rank's addresses once and sets each rank's part of them, 3 N
// + a few. The bytes it logs it read ("..., B bytes read") grow as N: its
// part of each peer's addresses (Note [Each rank reads its own part]), where
// whole values would be 136 (N - 1) bytes each.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "lockstep/core/error.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

struct SocketCounts {
  int listening = 0;
  int connected = 0;
};

std::string read_proc_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// The inodes of the sockets `pid` has open.
std::set<std::string> socket_inodes(const std::string& pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + pid + "/fd";
  DIR* dir = opendir(fd_dir.c_str());
  if (!dir) return inodes;
  while (dirent* entry = readdir(dir)) {
    char target[256];
    const ssize_t n = readlink((fd_dir + "/" + entry->d_name).c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    const std::string link(target, static_cast<size_t>(n));
    if (link.rfind("socket:[", 0) == 0) inodes.insert(link.substr(8, link.size() - 9));
  }
  closedir(dir);
  return inodes;
}

// The state of every TCP socket of this network namespace, by inode (0A
// listens, 01 is connected). The job's workers are this process's
// grandchildren and share its namespace, so one read of the tables serves a
// whole sweep (Note [One read of the tables a sweep] below).
std::map<std::string, std::string> tcp_states() {
  std::map<std::string, std::string> states;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::istringstream lines(read_proc_file(table));
    std::string line;
    std::getline(lines, line);  // header
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      states[inode] = state;
    }
  }
  return states;
}

SocketCounts count_sockets(const std::string& pid, const std::map<std::string, std::string>& states) {
  SocketCounts counts;
  for (const std::string& inode : socket_inodes(pid)) {
    const auto found = states.find(inode);
    if (found == states.end()) continue;
    if (found->second == "0A") ++counts.listening;
    if (found->second == "01") ++counts.connected;
  }
  return counts;
}

// RANK of a worker of the job whose command line mentions `marker`; -1 for
// any other process.
int worker_rank(const std::string& pid, const std::string& marker) {
  std::string cmdline = read_proc_file("/proc/" + pid + "/cmdline");
  if (cmdline.find(marker) == std::string::npos) return -1;
  std::string environ = read_proc_file("/proc/" + pid + "/environ");
  std::istringstream entries(environ);
  std::string entry;
  int rank = -1;
  bool worker = false;
  while (std::getline(entries, entry, '\0')) {
    if (entry.rfind("RANK=", 0) == 0) rank = std::stoi(entry.substr(5));
    if (entry.rfind("LOCAL_RANK=", 0) == 0) worker = true;
  }
  return worker ? rank : -1;
}

// Samples every worker of the job every 50 ms until `done`, keeping the most
// each rank held.
//
// Note [One read of the tables a sweep]: a rank's sockets are its socket
// inodes (/proc/PID/fd) looked up in the namespace's TCP tables. At 64 ranks
// on Gloo 1.13 those tables hold ~8,000 sockets (a connection and a listening
// port per pair), and the watcher, one thread among 64 busy ranks on 2 cores,
// gets a sliver of a core: reading the tables once per rank made a sweep take
// longer than the whole training phase, so a rank first seen half connected
// (57 of 63) was never seen again before it exited (a CI failure). One read of the
// tables per sweep keeps a sweep short however many ranks there are. The
// ranks' inodes are read after it: a socket opened in between is counted by
// the next sweep.
std::map<int, SocketCounts> watch_workers(const std::string& marker, const std::atomic<bool>& done, int& sweeps) {
  std::map<int, SocketCounts> most;
  while (!done) {
    std::map<int, std::string> workers;
    DIR* proc = opendir("/proc");
    while (dirent* entry = proc ? readdir(proc) : nullptr) {
      const std::string pid = entry->d_name;
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      const int rank = worker_rank(pid, marker);
      if (rank >= 0) workers[rank] = pid;
    }
    if (proc) closedir(proc);
    const std::map<std::string, std::string> states = tcp_states();
    for (const auto& [rank, pid] : workers) {
      const SocketCounts now = count_sockets(pid, states);
      SocketCounts& kept = most[rank];
      kept.listening = std::max(kept.listening, now.listening);
      kept.connected = std::max(kept.connected, now.connected);
    }
    ++sweeps;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return most;
}

struct StoreUse {
  int64_t operations = 0;
  int64_t bytes_read = 0;
};

// The store operations and bytes each rank reports for its world group, by rank.
std::map<int, StoreUse> store_use(const std::string& output, int nproc) {
  std::map<int, StoreUse> use;
  const std::regex line(
      "rank (\\d+) of (\\d+): world group ready after (\\d+) store operations, (\\d+) bytes read");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    if (std::stoi((*it)[2]) != nproc) continue;
    use[std::stoi((*it)[1])] = StoreUse{std::stoll((*it)[3]), std::stoll((*it)[4])};
  }
  return use;
}

// What a rank other than 0 may spend, whatever N: the rendezvous (3), Gloo's
// address exchange (3 per key family, 2 families on libtorch 1.13), the job
// token's check, with room to spare.
constexpr int64_t kStoreOperationsPerRank = 16;
// What a rank other than 0 may read per peer (and its rendezvous, spread):
// whole values would be 136 (N - 1) bytes per peer on libtorch 1.13.
constexpr int64_t kStoreBytesPerPeer = 256;
constexpr int64_t kStoreBytesOfRendezvous = 4096;

// `iterations`: enough for the watcher to see every rank after iteration 6.
void expect_one_mesh(int nproc, int iterations) {
  testing::TempDir dir;
  std::string config = testing::read_file(testing::source_dir() + "/tests/e2e/distributed_run.yaml");
  const std::string config_path = dir.file("connections.yaml");
  testing::write_file(config_path, config);
  std::atomic<bool> done{false};
  std::map<int, SocketCounts> most;
  int sweeps = 0;
  std::thread watcher([&] { most = watch_workers(config_path, done, sweeps); });
  // Every group is built by iteration 6 (the first log line, the first
  // evaluation); the rest of the run keeps them open while they are counted.
  auto run = testing::run_command({testing::lockstep_binary(), "train", config_path, "--work-dir", dir.file("work"),
                                   "--nproc", std::to_string(nproc), "--set", str_cat("train_cfg.max_iters=", iterations),
                                   "--set", "default_hooks.checkpoint.interval=1000"},
                                  {"OMP_NUM_THREADS=1"}, 300);
  done = true;
  watcher.join();
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_NE(run.output.find("Evaluation on val"), std::string::npos) << run.output;
  std::cout << sweeps << " sweeps of the workers' sockets\n";
  ASSERT_EQ(static_cast<int>(most.size()), nproc) << "workers seen: " << most.size();
  const std::map<int, StoreUse> use = store_use(run.output, nproc);
  ASSERT_EQ(static_cast<int>(use.size()), nproc) << run.output;
  for (const auto& [rank, counts] : use) {
    std::cout << "rank " << rank << ": " << counts.operations << " store operations, " << counts.bytes_read
              << " bytes read\n";
    EXPECT_LE(counts.operations, rank == 0 ? 3 * nproc + kStoreOperationsPerRank : kStoreOperationsPerRank)
        << "rank " << rank;
    // Its part of each peer's addresses and host name, 144 + ~30 bytes.
    if (rank != 0) {
      EXPECT_LE(counts.bytes_read, kStoreBytesPerPeer * nproc + kStoreBytesOfRendezvous) << "rank " << rank;
    }
  }
  for (const auto& [rank, counts] : most) {
    std::cout << "rank " << rank << ": at most " << counts.listening << " listening ports, " << counts.connected
              << " connections\n";
    EXPECT_GE(counts.connected, nproc - 1) << "rank " << rank << ": a mesh has a connection per peer";
    EXPECT_LE(counts.listening, nproc + 8) << "rank " << rank;
    EXPECT_LE(counts.connected, nproc + 8) << "rank " << rank;
  }
}

TEST(Connections, EightDdpRanksHoldOneMeshEach) { expect_one_mesh(8, 120); }

TEST(Connections, SixtyFourDdpRanksHoldOneMeshEach) { expect_one_mesh(64, 18); }

}  // namespace
}  // namespace lockstep
