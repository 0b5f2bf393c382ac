// Small helpers shared by the benchmarks: robust timing statistics and a
// table printer. Benchmarks compare against a baseline measured in the same
// run, alternating the two, because this kind of machine is noisy.
#pragma once

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/compat/cuda.h"
#include "lockstep/comm/env.h"
#include "lockstep/strategy/device_choice.h"

namespace lockstep::bench {

// Wall-clock seconds, comparable across the processes of one machine (a
// driver and the workers it starts).
inline double wall_now() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// One round's two contenders in the round's order: `ours` first in even
// rounds, `theirs` first in odd ones. The machine's speed drifts within a
// round too, and a fixed order would lean the ratio one way.
template <typename Ours, typename Theirs>
void in_alternating_order(int round, const Ours& ours, const Theirs& theirs) {
  if (round % 2 == 0) {
    ours();
    theirs();
  } else {
    theirs();
    ours();
  }
}

// The path of the running benchmark binary (a driver starts its workers as
// copies of itself through the launcher).
inline std::string self_path() {
  char buffer[4096];
  ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  buffer[n > 0 ? n : 0] = '\0';
  return buffer;
}

// Environment variable as integer, with a default (BENCH_ITERS=200 ...).
inline long env_int(const char* name, long fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtol(value, nullptr, 10) : fallback;
}

// BENCH_DEVICE (cpu, the default, or cuda): where a distributed bench's
// workers train. On cuda each rank takes cuda:LOCAL_RANK and NCCL.
inline std::string bench_device_name() {
  const char* device = std::getenv("BENCH_DEVICE");
  return device != nullptr && *device != '\0' ? device : "cpu";
}
// Called by a worker before init_from_env: its device, made current.
inline torch::Device place_bench_worker() {
  const DistEnv env = detect_dist_env();
  return place_on_device(bench_device_name(), LocalPlace{env.local_rank, env.local_world_size}, "BENCH_DEVICE");
}

// Peak memory of the CUDA caching allocator on a GPU, for the benchmarks that
// run there: reset before a measurement, read after it (MiB; -1 off a GPU).
inline void reset_cuda_peak(int device) { compat::reset_cuda_peak_memory(device); }
inline double cuda_peak_mib(int device) {
  auto stats = compat::cuda_memory_stats(device);
  return stats ? static_cast<double>(stats->peak_allocated) / (1024.0 * 1024.0) : -1;
}

// The seconds of the first line "RESULT <fields...> <seconds>" in `output`
// whose leading fields are `fields` (after any "[rank0]: " prefix a launcher
// adds); NaN when there is none.
//   double s = bench::result_seconds(output, {"lockstep", "cnn"});  // "RESULT lockstep cnn 0.0123"
inline double result_seconds(const std::string& output, const std::vector<std::string>& fields) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    auto at = line.find("RESULT ");
    if (at == std::string::npos) continue;
    std::istringstream words(line.substr(at + 7));
    bool match = true;
    for (const auto& field : fields) {
      std::string word;
      match = match && (words >> word) && word == field;
    }
    double seconds = 0;
    if (match && words >> seconds) return seconds;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// main() of a bench whose driver starts copies of itself as workers:
// `<bench> worker <mode> <model> <iters>` runs worker(mode, model, iters),
// anything else the driver; an exception ends it with its message and 1.
//   int main(int argc, char** argv) { return bench::worker_or_driver(argc, argv, "bench_ddp", worker, driver); }
inline int worker_or_driver(int argc, char** argv, const char* name,
                            int (*worker)(const std::string&, const std::string&, int), int (*driver)()) {
  try {
    if (argc >= 5 && std::string(argv[1]) == "worker") return worker(argv[2], argv[3], std::stoi(argv[4]));
    return driver();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", name, error.what());
    return 1;
  }
}

}  // namespace lockstep::bench
