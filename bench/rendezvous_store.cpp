// bench/rendezvous_store: where the workers of an etcd job should meet. With
// --rdzv-backend etcd, node 0 of each round hosts a TCPStore for that round's
// workers (lockstep/launch/etcd_rendezvous.h); the alternative is to keep the
// workers' store on etcd too. This measures what each costs the workers'
// start: N ranks build their world group (lockstep's rendezvous, then Gloo's
// full mesh, where every rank publishes its address and reads every other's)
// over a TCPStore, and over an etcd cluster of three members (a c10d store
// whose every key is an etcd key: each write a Raft write to a quorum), in
// the same run, alternating. The figure is the time from the last rank's
// arrival to the last rank's group being ready, and its ratio etcd / TCPStore.
//
//   build/bench/bench_rendezvous_store        # BENCH_STORE_NS=16,64 (ranks), BENCH_STORE_REPEATS=2
//   build/bench/bench_rendezvous_store worker tcp|etcd ENDPOINTS OUT_DIR   (what lockstep run starts)

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/bench_util.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/env.h"
#include "lockstep/comm/init.h"
#include "lockstep/launch/etcd_client.h"
#include "tests/support/etcd_server.h"
#include "tests/support/test_support.h"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

// A c10d store whose keys are etcd keys under `prefix`: what keeping the
// workers' store on etcd would mean. One per process, used from one thread.
class EtcdStore : public compat::StoreBase {
 public:
  EtcdStore(EtcdOptions options, std::string prefix, std::chrono::milliseconds timeout)
      : compat::StoreBase(timeout), options_(options), etcd_(std::move(options)), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    etcd_.put(prefix_ + key, std::string(value.begin(), value.end()));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    wait({key}, timeout_);
    const auto kv = etcd_.get(prefix_ + key);
    LOCKSTEP_CHECK(kv.has_value(), "EtcdStore: ", key, " vanished");
    return bytes(kv->value);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    while (true) {  // compare-and-swap until no one else added in between
      const auto kv = etcd_.get(prefix_ + key);
      const int64_t value = (kv ? std::stoll(kv->value) : 0) + delta;
      if (etcd_.put_if(prefix_ + key, std::to_string(value), kv ? kv->mod_revision : 0)) return value;
    }
  }
  bool deleteKey(const std::string& key) override {
    etcd_.erase(prefix_ + key);
    return true;
  }
  bool check(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) {
      if (!etcd_.get(prefix_ + key)) return false;
    }
    return true;
  }
  int64_t getNumKeys() override { return static_cast<int64_t>(etcd_.get_prefix(prefix_).size()); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto& key : keys) {
      while (true) {
        int64_t revision = 0;
        if (etcd_.get(prefix_ + key, &revision)) break;
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        LOCKSTEP_CHECK(left.count() > 0, "EtcdStore: timed out waiting for ", key);
        etcd_.watch_prefix(prefix_ + key, revision, left, [] { return false; });
      }
    }
  }

 protected:
  // A client of its own: the same keys over another connection.
  c10::intrusive_ptr<compat::C10dStore> clone_store() override {
    return c10::make_intrusive<EtcdStore>(options_, prefix_, timeout_);
  }

 private:
  EtcdOptions options_;
  EtcdClient etcd_;
  std::string prefix_;
};

int worker(const std::string& kind, const std::string& endpoints, const std::string& out_dir) {
  logger().set_level(spdlog::level::warn);
  const DistEnv env = detect_dist_env();
  const auto timeout = std::chrono::seconds(300);
  const double arrived = bench::wall_now();
  if (kind == "tcp") {
    init_from_env("auto", "gloo", timeout);  // the launcher's TCPStore, as node 0's in an etcd round
  } else {
    EtcdOptions options;
    options.endpoints = split_etcd_endpoints(endpoints);
    InitOptions init;
    init.rank(env.rank).world_size(env.world_size).master_addr("127.0.0.1").timeout(timeout)
        .store(c10::make_intrusive<EtcdStore>(options, "/bench/" + fs::path(out_dir).filename().string() + "/",
                                              timeout));
    init_process_group(init);
  }
  const double ready = bench::wall_now();
  destroy_process_group();
  std::ofstream(out_dir + "/rank_" + std::to_string(env.rank) + ".txt") << std::fixed << arrived << " " << ready << "\n";
  return 0;
}

struct Setup {
  bool ok = false;
  double seconds = 0;  // the last rank's arrival to the last rank's group ready
  std::string output;
};

Setup run(const std::string& kind, int n, const std::string& endpoints, const std::string& out_dir) {
  fs::remove_all(out_dir);
  fs::create_directories(out_dir);
  auto result = testing::run_command({testing::lockstep_binary(), "run", "--standalone", "--nproc-per-node",
                                      std::to_string(n), "--no-prefix", "--", bench::self_path(), "worker", kind,
                                      endpoints, out_dir},
                                     {"OMP_NUM_THREADS=1", "LOCKSTEP_TIMEOUT_S=300"}, 900);
  Setup setup;
  setup.output = result.output;
  if (result.exit_code != 0) return setup;
  double last_arrival = 0, last_ready = 0;
  for (int rank = 0; rank < n; ++rank) {
    std::ifstream in(out_dir + "/rank_" + std::to_string(rank) + ".txt");
    double arrived = 0, ready = 0;
    if (!(in >> arrived >> ready)) return setup;
    last_arrival = std::max(last_arrival, arrived);
    last_ready = std::max(last_ready, ready);
  }
  setup.ok = true;
  setup.seconds = last_ready - last_arrival;
  return setup;
}

std::vector<int> sizes() {
  const char* text = std::getenv("BENCH_STORE_NS");
  std::istringstream in(text != nullptr ? text : "16,64");
  std::vector<int> ns;
  std::string item;
  while (std::getline(in, item, ',')) ns.push_back(std::stoi(item));
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && std::string(argv[1]) == "worker") return worker(argv[2], argv[3], argv[4]);
  if (auto why = testing::EtcdServer::missing(); !why.empty()) {
    std::printf("bench_rendezvous_store: %s\n", why.c_str());
    return 1;
  }
  const int repeats = static_cast<int>(bench::env_int("BENCH_STORE_REPEATS", 2));
  testing::EtcdServer etcd(std::nullopt, 3);
  const fs::path out = fs::temp_directory_path() / ("bench_rendezvous_store_" + std::to_string(getpid()));
  std::printf("Gloo world group over a TCPStore (node 0's, as in an etcd round) and over a 3-member etcd "
              "(%s), libtorch %s, %d runs each, alternating\n", etcd.endpoint().c_str(), compat::torch_version().c_str(),
              repeats);
  int run_index = 0;
  for (int n : sizes()) {
    std::vector<double> tcp, on_etcd;
    for (int r = 0; r < repeats; ++r) {
      for (const std::string kind : {"tcp", "etcd"}) {
        const Setup s = run(kind, n, etcd.endpoint(), (out / (kind + std::to_string(++run_index))).string());
        if (!s.ok) {
          std::printf("N=%d %s: failed\n%s\n", n, kind.c_str(), s.output.c_str());
          return 1;
        }
        (kind == "tcp" ? tcp : on_etcd).push_back(s.seconds);
        std::printf("  N=%-3d %-5s %.3f s\n", n, kind.c_str(), s.seconds);
        std::fflush(stdout);
      }
    }
    const double t = bench::median(tcp), e = bench::median(on_etcd);
    std::printf("RESULT rendezvous_store N=%d: TCPStore %.3f s, etcd %.3f s (medians), etcd / TCPStore = %.1f\n", n,
                t, e, e / t);
  }
  fs::remove_all(out);
  return 0;
}
