// bench/scaling: what starting, checkpointing and ending a job costs as the
// number of ranks grows, under `lockstep run` and under torchrun (Debian's
// python3-torch) starting the same workers in the same run.
//
// Two kinds of worker. A whole one is a lockstep run (Runner, DDP over Gloo,
// a tiny MLP, one iteration, a checkpoint) that records when it started, when
// its first step ended (after DDP's all-reduce: every rank is in) and when its
// checkpoint was written; a light one rendezvouses, builds the world group,
// all-reduces once and exits (what fits 128 ranks on one host). The driver
// adds when the launcher exited. For each N the two launchers alternate; the
// ratio lockstep / torchrun of the time to the first step is the figure of
// merit (the rest is the same worker code). At the largest N that ran (light),
// lockstep runs twice more, once with a stranger hammering the launcher's
// store port with garbage connections the whole time. At 32 ranks the weights
// after the whole workers' step are compared with one process stepping on the
// whole global batch.
//
//   build/bench/bench_scaling       # BENCH_SCALING_NS=8,16,32,64 BENCH_SCALING_LIGHT_NS=8,16,32,64,128
//   build/bench/bench_scaling worker OUT_DIR    # (what the launchers start)
//   build/bench/bench_scaling light OUT_DIR
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "bench/bench_util.h"
#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/config/config.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/init.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/runner/runner.h"
#include "tests/support/test_support.h"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kGlobalBatch = 64;

std::string worker_config(int world_size) {
  const int64_t per_rank = std::max<int64_t>(1, kGlobalBatch / world_size);
  std::ostringstream yaml;
  yaml << "randomness: {seed: 5}\n"
       << "model: {type: MLP, in_features: 64, hidden: [32], num_classes: 10,\n"
       << "        data_preprocessor: {type: ImgDataPreprocessor, mean: [100.0], std: [60.0]}}\n"
       << "train_dataloader:\n"
       << "  batch_size: " << per_rank << "\n"
       << "  num_workers: 0\n"
       << "  sampler: {type: DefaultSampler, shuffle: false}\n"
       << "  dataset: {type: SyntheticImages, size: 256, height: 8, width: 8, seed: 1}\n"
       << "train_cfg: {max_iters: 1, by_epoch: false}\n"
       << "optim_wrapper: {optimizer: {type: SGD, lr: 0.1}}\n"
       << "strategy: " << (world_size > 1 ? "{type: DDPStrategy, backend: gloo, launcher: auto, timeout_s: 300}"
                                          : "{type: SingleDeviceStrategy}")
       << "\n"
       << "default_hooks:\n"
       << "  logger: {interval: 1}\n"
       << "  checkpoint: {by_epoch: false, interval: 1, save_last: false}\n"
       << "custom_hooks:\n"
       << "  - {type: ScalingTimeline, event: first_step, priority: HIGHEST}\n"
       << "  - {type: ScalingTimeline, event: checkpoint, priority: LOWEST}\n";
  return yaml.str();
}

// Records the wall time of an event after the first iteration's step (run
// first among the hooks) or after its checkpoint (run last).
std::map<std::string, double>& timeline() {
  static std::map<std::string, double> events;
  return events;
}
class ScalingTimeline : public Hook {
 public:
  explicit ScalingTimeline(std::string event) : Hook("ScalingTimeline"), event_(std::move(event)) {}
  void after_step() override {
    if (trainer().iter() == 0) timeline()[event_] = bench::wall_now();
  }

 private:
  std::string event_;
};
LOCKSTEP_REGISTER(hook_registry(), "ScalingTimeline", [](const Config& config, const HookContext&) {
  return std::make_shared<ScalingTimeline>(config.get<std::string>("event"));
});

int worker(const std::string& out_dir) {
  const double started = bench::wall_now();
  logger().set_level(spdlog::level::warn);
  const DistEnv env = detect_dist_env();
  Config config = parse_config(worker_config(env.world_size), "scaling.yaml");
  {
    Runner runner(config, RunnerOptions().work_dir(out_dir + "/work"));
    runner.train();
  }
  const double ended = bench::wall_now();
  std::ofstream(out_dir + "/rank_" + std::to_string(env.rank) + ".txt")
      << std::fixed << started << " " << timeline()["first_step"] << " " << timeline()["checkpoint"] << " " << ended
      << "\n";
  return 0;
}

// What the 128-rank runs start (each whole worker would need more ports than
// one host has: BENCHMARKS.md): rendezvous, the world group, one all-reduce,
// exit. "first step" is the all-reduce's end; there is no checkpoint.
int light_worker(const std::string& out_dir) {
  const double started = bench::wall_now();
  logger().set_level(spdlog::level::warn);
  const DistEnv env = detect_dist_env();
  init_from_env("auto", "gloo", std::chrono::seconds(300));
  torch::Tensor one = torch::ones({1});
  world()->all_reduce(one);
  const double reduced = bench::wall_now();
  LOCKSTEP_CHECK(one.item<float>() == static_cast<float>(env.world_size), "light worker: the all-reduce gave ",
                 one.item<float>(), " instead of ", env.world_size);
  destroy_process_group();
  const double ended = bench::wall_now();
  std::ofstream(out_dir + "/rank_" + std::to_string(env.rank) + ".txt")
      << std::fixed << started << " " << reduced << " " << reduced << " " << ended << "\n";
  return 0;
}

struct Times {
  double first_step = 0, checkpoint = 0, exit = 0, slowest_start = 0;
  bool ok = false;
  std::string output;
};

// Times from the launcher's start: the last rank's first step, the last
// rank's checkpoint, the launcher's exit; and when the last worker started.
Times run_job(const std::vector<std::string>& argv, int nproc, const std::string& out_dir) {
  fs::remove_all(out_dir);
  fs::create_directories(out_dir);
  Times times;
  const double launched = bench::wall_now();
  auto result = testing::run_command(argv, {"OMP_NUM_THREADS=1", "LOCKSTEP_TIMEOUT_S=300"}, 900);
  times.exit = bench::wall_now() - launched;
  times.output = result.output;
  if (result.exit_code != 0) return times;
  for (int rank = 0; rank < nproc; ++rank) {
    std::ifstream in(out_dir + "/rank_" + std::to_string(rank) + ".txt");
    double started = 0, first = 0, checkpoint = 0, ended = 0;
    if (!(in >> started >> first >> checkpoint >> ended)) return times;
    times.slowest_start = std::max(times.slowest_start, started - launched);
    times.first_step = std::max(times.first_step, first - launched);
    times.checkpoint = std::max(times.checkpoint, checkpoint - launched);
  }
  times.ok = true;
  return times;
}

// kind: "worker" (a whole lockstep run) or "light" (light_worker).
std::vector<std::string> lockstep_run(int nproc, int port, const std::string& out_dir, const std::string& kind) {
  return {testing::lockstep_binary(), "run", "--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
          "--master-port", std::to_string(port), "--nproc-per-node", std::to_string(nproc), "--no-prefix", "--",
          bench::self_path(), kind, out_dir};
}

std::vector<std::string> torchrun(int nproc, int port, const std::string& out_dir, const std::string& kind) {
  std::vector<std::string> argv = testing::torchrun();
  argv.insert(argv.end(), {"--no_python", "--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1",
                           "--master_port", std::to_string(port), "--nproc_per_node", std::to_string(nproc),
                           bench::self_path(), kind, out_dir});
  return argv;
}

// A stranger on the store's port: connects, writes random bytes, hangs up,
// again and again, until told to stop. Returns how many connections it made.
long hammer(int port, const std::atomic<bool>& stop) {
  std::mt19937 random(7);
  long connections = 0;
  while (!stop) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
      ++connections;
      char garbage[256];
      for (auto& byte : garbage) byte = static_cast<char>(random());
      ssize_t ignored = ::write(fd, garbage, 1 + random() % sizeof(garbage));
      (void)ignored;
    }
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return connections;
}

double relative_difference(const std::string& a, const std::string& b) {
  auto left = read_checkpoint_file(a).get("model").tensors;
  auto right = read_checkpoint_file(b).get("model").tensors;
  double worst = 0;
  for (const auto& [name, tensor] : left) {
    const torch::Tensor other = right.at(name);
    const double scale = tensor.abs().max().item<double>();
    worst = std::max(worst, (tensor - other).abs().max().item<double>() / (scale > 0 ? scale : 1));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "worker") return worker(argv[2]);
  if (argc >= 3 && std::string(argv[1]) == "light") return light_worker(argv[2]);
  const auto sizes_from = [](const char* variable, const char* fallback) {
    std::vector<int> sizes;
    const char* text = std::getenv(variable);
    std::stringstream list(text != nullptr ? text : fallback);
    for (std::string item; std::getline(list, item, ',');) {
      if (!item.empty()) sizes.push_back(std::stoi(item));
    }
    return sizes;
  };
  const std::vector<int> whole_sizes = sizes_from("BENCH_SCALING_NS", "8,16,32,64");
  const std::vector<int> light_sizes = sizes_from("BENCH_SCALING_LIGHT_NS", "8,16,32,64,128");
  const bool with_torchrun = testing::python_has("torch");
  const std::string root = fs::temp_directory_path() / ("lockstep_bench_scaling_" + std::to_string(getpid()));
  int port = 29600 + static_cast<int>(getpid() % 300);
  std::printf("scaling: 'whole' workers are one lockstep run per rank (Runner, DDP over Gloo, MLP 64-32-10, 1 "
              "iteration, a checkpoint); 'light' workers rendezvous, build the world group, all-reduce once and "
              "exit; 1 thread each, %u cores\n",
              std::thread::hardware_concurrency());
  std::printf("%6s  %-30s %12s %12s %12s %12s\n", "ranks", "launcher", "last start", "first step", "checkpoint",
              "exit");
  const auto row = [](int n, const std::string& name, const Times& t) {
    if (!t.ok) {
      std::printf("%6d  %-30s FAILED\n%s\n", n, name.c_str(),
                  t.output.substr(t.output.size() > 4000 ? t.output.size() - 4000 : 0).c_str());
      return;
    }
    std::printf("%6d  %-30s %10.2f s %10.2f s %10.2f s %10.2f s\n", n, name.c_str(), t.slowest_start, t.first_step,
                t.checkpoint, t.exit);
    std::fflush(stdout);
  };
  std::vector<std::string> results;
  // Both launchers at each N, alternating which goes first. Returns lockstep's times.
  int turn_order = 0;
  const auto compare = [&](int n, const std::string& kind) {
    Times ours, theirs;
    const std::string what = kind == "light" ? " (light)" : "";
    for (int turn = 0; turn < 2; ++turn) {
      const bool lockstep_turn = (turn == 0) == (turn_order % 2 == 0);
      const std::string out = root + "/" + kind + (lockstep_turn ? "_lockstep_" : "_torchrun_") + std::to_string(n);
      if (lockstep_turn) {
        ours = run_job(lockstep_run(n, ++port, out, kind), n, out);
        row(n, "lockstep run" + what, ours);
      } else if (with_torchrun) {
        theirs = run_job(torchrun(n, ++port, out, kind), n, out);
        row(n, "torchrun" + what, theirs);
      }
    }
    ++turn_order;
    if (ours.ok && theirs.ok) {
      char line[256];
      std::snprintf(line, sizeof(line),
                    "RESULT scaling %s N=%d time to first step lockstep/torchrun = %.3f (%.2f s / %.2f s); last start "
                    "to first step %.2f s / %.2f s; exit %.3f",
                    kind.c_str(), n, ours.first_step / theirs.first_step, ours.first_step, theirs.first_step,
                    ours.first_step - ours.slowest_start, theirs.first_step - theirs.slowest_start,
                    ours.exit / theirs.exit);
      results.push_back(line);
    }
    return ours;
  };
  for (int n : whole_sizes) {
    const Times ours = compare(n, "worker");
    if (n == 32 && ours.ok) {
      // One process on the whole global batch, the same first step.
      const std::string single = root + "/single";
      fs::remove_all(single);
      fs::create_directories(single);
      auto result = testing::run_command({bench::self_path(), "worker", single}, {"OMP_NUM_THREADS=1"}, 300);
      if (result.exit_code == 0) {
        char line[256];
        std::snprintf(line, sizeof(line),
                      "RESULT scaling DDP at 32 ranks (batch 2 each) vs one process (batch 64): max relative "
                      "difference of the weights after the step = %.2e (bound 1e-5)",
                      relative_difference(root + "/worker_lockstep_32/work/model_0000000.ckpt",
                                          single + "/work/model_0000000.ckpt"));
        results.push_back(line);
      }
    }
  }
  int largest_light = 0;
  for (int n : light_sizes) {
    if (compare(n, "light").ok) largest_light = n;
  }
  if (largest_light > 0) {
    // The stranger at the largest N that ran: once without, once with.
    const int n = largest_light;
    const std::string again = root + "/again_" + std::to_string(n);
    Times ours = run_job(lockstep_run(n, ++port, again, "light"), n, again);
    row(n, "lockstep run (light, again)", ours);
    std::atomic<bool> stop{false};
    const int hammered_port = ++port;
    long connections = 0;
    std::thread stranger([&] { connections = hammer(hammered_port, stop); });
    const std::string out = root + "/garbage_" + std::to_string(n);
    Times garbage = run_job(lockstep_run(n, hammered_port, out, "light"), n, out);
    stop = true;
    stranger.join();
    row(n, "lockstep run (light) + garbage", garbage);
    char line[256];
    std::snprintf(line, sizeof(line),
                  "RESULT scaling light N=%d with %ld garbage connections to the store meanwhile: %s, first step "
                  "%.2f s (%.3f of the run just before without)",
                  n, connections, garbage.ok ? "finished" : "FAILED", garbage.first_step,
                  ours.ok && garbage.ok ? garbage.first_step / ours.first_step : 0.0);
    results.push_back(line);
  }
  for (const auto& line : results) std::printf("%s\n", line.c_str());
  fs::remove_all(root);
  return 0;
}
