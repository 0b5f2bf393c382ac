// Collective bandwidth on 2 ranks over loopback: lockstep's ProcessGroup
// facade against raw c10d calls in the same run, and the ring
// reduce_scatter against all_reduce-then-slice.
//
//   build/bench/bench_collectives                 # starts itself on 2 ranks
//   bin/lockstep run --standalone --nproc-per-node 2 -- build/bench/bench_collectives
//   BENCH_MAX_MIB=4 build/bench/bench_collectives  # a quicker sweep
//
// Bus bandwidth follows nccl-tests: algbw = bytes / time with bytes the full
// tensor (all_reduce), the input (reduce_scatter) or the output (all_gather);
// busbw = algbw * 2(n-1)/n for all_reduce and (n-1)/n for the other two.
// "raw" calls the backend object directly and waits; for reduce_scatter and
// all_gather on libtorch 1.13, whose Gloo has neither op, "raw" is the same
// ring driven without the facade, so the ratio is the facade's own cost.
// Where Gloo has native ops (2.x) the ring is also timed against them.
// Variants are measured in alternating blocks; times are medians over blocks
// and the overhead is the median over blocks of facade/raw in the same block,
// since a shared 2-core machine is noisy.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "lockstep/compat/c10d.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/internal/ring.h"
#include "lockstep/launch/launcher.h"

namespace {

using lockstep::ProcessGroup;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

long env_long(const char* name, long fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtol(value, nullptr, 10) : fallback;
}

std::string human(int64_t bytes) {
  char buffer[32];
  if (bytes >= (1 << 20)) {
    std::snprintf(buffer, sizeof(buffer), "%lld MiB", static_cast<long long>(bytes >> 20));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%lld KiB", static_cast<long long>(bytes >> 10));
  }
  return buffer;
}

// Per variant: the median seconds per call over `blocks` blocks of `iters`
// rounds, and the median over blocks of its time relative to variant 0's in
// the same block. Inside a block the variants alternate call by call (and
// the order flips every round), so both see the same moment of a shared,
// noisy 2-core machine: the ratio compares like with like. Every rank
// reports the slowest rank's numbers.
struct Timing {
  std::vector<double> seconds;
  std::vector<double> ratio_to_first;
};

Timing measure(ProcessGroup& group, const std::vector<std::function<void()>>& variants, int iters, int blocks) {
  const size_t count = variants.size();
  std::vector<std::vector<double>> samples(count), ratios(count);
  for (auto& variant : variants) variant();  // warm-up: buffers, connections
  for (int b = 0; b < blocks; ++b) {
    std::vector<double> block(count, 0.0);
    group.barrier();
    for (int i = 0; i < iters; ++i) {
      for (size_t k = 0; k < count; ++k) {
        size_t v = (k + static_cast<size_t>(i + b)) % count;  // rotate who goes first
        auto start = Clock::now();
        variants[v]();
        block[v] += std::chrono::duration<double>(Clock::now() - start).count();
      }
    }
    for (size_t v = 0; v < count; ++v) {
      samples[v].push_back(block[v] / iters);
      ratios[v].push_back(block[v] / block[0]);
    }
  }
  auto result = torch::empty({2 * static_cast<int64_t>(count)}, torch::kDouble);
  for (size_t v = 0; v < count; ++v) {
    result[static_cast<int64_t>(v)] = median(samples[v]);
    result[static_cast<int64_t>(count + v)] = median(ratios[v]);
  }
  group.all_reduce(result, lockstep::ReduceOp::kMax);
  Timing timing;
  for (size_t v = 0; v < count; ++v) {
    timing.seconds.push_back(result[static_cast<int64_t>(v)].item<double>());
    timing.ratio_to_first.push_back(result[static_cast<int64_t>(count + v)].item<double>());
  }
  return timing;
}

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

void wait_raw(const c10::intrusive_ptr<lockstep::compat::C10dWork>& work) { work->wait(); }

int run_benchmark() {
  auto world = lockstep::init_from_env("pytorch");
  const int n = world->size(), rank = world->rank();
  auto raw = world->raw();
  const bool main = rank == 0;
  const int64_t max_bytes = env_long("BENCH_MAX_MIB", 64) << 20;
  const int blocks = static_cast<int>(env_long("BENCH_BLOCKS", 21));
  if (main) {
    std::printf("bench_collectives: libtorch %s, %d ranks, float32, Gloo over loopback, %d cores\n",
                lockstep::compat::torch_version().c_str(), n, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
    std::printf("reduce_scatter uses '%s', all_gather_into_tensor uses '%s' in the facade\n\n",
                collective_algorithm(*world, torch::zeros({1}), true).c_str(),
                collective_algorithm(*world, torch::zeros({1}), false).c_str());
    std::printf("%-15s %8s %11s %11s %12s %12s %9s\n", "op", "size", "facade ms", "raw ms", "facade GB/s",
                "raw GB/s", "overhead");
  }
  const double ring_factor = static_cast<double>(n - 1) / n;
  struct Row {
    std::string op;
    int64_t bytes;
    double facade, raw;
    double overhead;  // median over blocks of facade/raw - 1
  };
  std::vector<Row> rows;
  std::vector<std::pair<int64_t, std::vector<double>>> ring_vs_slice, gather_algorithms;
  const bool native_rs = has_native_collective(*world, torch::zeros({1}), true);
  const bool native_ag = has_native_collective(*world, torch::zeros({1}), false);
  auto deadline = [&] { return Clock::now() + world->timeout(); };
  int tag = 0;  // raw ring calls use their own tags, below the facade's
  for (int64_t bytes = 4 << 10; bytes <= max_bytes; bytes *= 4) {
    const int64_t numel = bytes / 4;
    const int iters = static_cast<int>(std::clamp<int64_t>((int64_t{32} << 20) / bytes, 3, 50));
    auto full = torch::rand({numel});
    auto part = torch::empty({numel / n});
    auto gathered = torch::empty({numel});
    auto piece = torch::rand({numel / n});

    // all_reduce
    auto times = measure(*world,
                         {[&] { world->all_reduce(full); },
                          [&] {
                            std::vector<at::Tensor> tensors{full};
                            wait_raw(raw->allreduce(tensors));
                          }},
                         iters, blocks);
    rows.push_back({"all_reduce", bytes, times.seconds[0], times.seconds[1], 1 / times.ratio_to_first[1] - 1});

    // reduce_scatter: facade (default algorithm) vs raw; ring vs all_reduce-then-slice
    std::function<void()> raw_reduce_scatter;
    if (collective_algorithm(*world, full, true) == "native") {
      raw_reduce_scatter = [&] { wait_raw(raw->_reduce_scatter_base(part, full)); };
    } else {
      raw_reduce_scatter = [&] {
        lockstep::detail::ring_reduce_scatter(*raw, rank, n, full, part, lockstep::detail::RingReduce::kSum,
                                              1000 + (tag++ % 1000), deadline());
      };
    }
    times = measure(*world, {[&] { world->reduce_scatter_tensor(part, full); }, raw_reduce_scatter}, iters, blocks);
    rows.push_back({"reduce_scatter", bytes, times.seconds[0], times.seconds[1], 1 / times.ratio_to_first[1] - 1});
    // The facade's reduce_scatter algorithms against each other.
    using lockstep::CollectiveAlgorithm;
    auto rs_with = [&](CollectiveAlgorithm algorithm) {
      return std::function<void()>([&, algorithm] {
        world->set_algorithms({algorithm, CollectiveAlgorithm::kAuto});
        world->reduce_scatter_tensor(part, full);
      });
    };
    std::vector<std::function<void()>> rs_variants{rs_with(CollectiveAlgorithm::kRing),
                                                   rs_with(CollectiveAlgorithm::kAllReduce)};
    if (native_rs) rs_variants.push_back(rs_with(CollectiveAlgorithm::kNative));
    times = measure(*world, rs_variants, iters, blocks);
    world->set_algorithms({CollectiveAlgorithm::kAuto, CollectiveAlgorithm::kAuto});
    ring_vs_slice.push_back({bytes, times.seconds});

    // all_gather_into_tensor
    std::function<void()> raw_all_gather;
    if (collective_algorithm(*world, full, false) == "native") {
      raw_all_gather = [&] { wait_raw(raw->_allgather_base(gathered, piece)); };
    } else {
      raw_all_gather = [&] {
        std::vector<at::Tensor> chunks;
        for (int r = 0; r < n; ++r) chunks.push_back(gathered.narrow(0, r * (numel / n), numel / n));
        chunks[static_cast<size_t>(rank)].copy_(piece);
        lockstep::detail::ring_all_gather(*raw, rank, n, chunks, 1000 + (tag++ % 1000), deadline());
      };
    }
    times = measure(*world, {[&] { world->all_gather_into_tensor(gathered, piece); }, raw_all_gather}, iters, blocks);
    rows.push_back({"all_gather", bytes, times.seconds[0], times.seconds[1], 1 / times.ratio_to_first[1] - 1});
    if (native_ag) {
      auto ag_with = [&](CollectiveAlgorithm algorithm) {
        return std::function<void()>([&, algorithm] {
          world->set_algorithms({CollectiveAlgorithm::kAuto, algorithm});
          world->all_gather_into_tensor(gathered, piece);
        });
      };
      times = measure(*world, {ag_with(CollectiveAlgorithm::kRing), ag_with(CollectiveAlgorithm::kNative)}, iters,
                      blocks);
      world->set_algorithms({CollectiveAlgorithm::kAuto, CollectiveAlgorithm::kAuto});
      gather_algorithms.push_back({bytes, times.seconds});
    }

    if (main) {
      for (size_t i = rows.size() - 3; i < rows.size(); ++i) {
        const Row& row = rows[i];
        double factor = row.op == "all_reduce" ? 2 * ring_factor : ring_factor;
        double facade_bw = row.bytes / row.facade * factor / 1e9, raw_bw = row.bytes / row.raw * factor / 1e9;
        std::printf("%-15s %8s %11.3f %11.3f %12.3f %12.3f %+8.1f%%\n", row.op.c_str(), human(row.bytes).c_str(),
                    row.facade * 1e3, row.raw * 1e3, facade_bw, raw_bw, row.overhead * 100);
      }
      std::fflush(stdout);
    }
  }
  // The facade's own cost per call, free of the network's noise: CPU time of
  // the calling thread (a blocked wait costs none; Gloo moves the bytes on its
  // own threads), facade and raw all_reduce of 1 MiB alternating.
  double facade_cpu = 0, raw_cpu = 0, raw_wall = 0;
  if (max_bytes >= (1 << 20)) {
    auto tensor = torch::rand({(1 << 20) / 4});
    std::vector<at::Tensor> tensors{tensor};
    const int calls = static_cast<int>(env_long("BENCH_CPU_CALLS", 400));
    world->barrier();
    for (int i = 0; i < 2 * calls; ++i) {
      const bool facade = (i % 4 == 0 || i % 4 == 3);  // facade, raw, raw, facade, ...
      double start = thread_cpu_seconds();
      auto wall_start = Clock::now();
      if (facade) {
        world->all_reduce(tensor);
      } else {
        wait_raw(raw->allreduce(tensors));
      }
      double cpu = thread_cpu_seconds() - start;
      (facade ? facade_cpu : raw_cpu) += cpu;
      if (!facade) raw_wall += std::chrono::duration<double>(Clock::now() - wall_start).count();
    }
    auto means = torch::tensor({facade_cpu / calls, raw_cpu / calls, raw_wall / calls}, torch::kDouble);
    world->all_reduce(means, lockstep::ReduceOp::kMax);  // the slowest rank's
    facade_cpu = means[0].item<double>();
    raw_cpu = means[1].item<double>();
    raw_wall = means[2].item<double>();
  }
  // bfloat16 all_reduce goes through float32 on Gloo 1.13: what that costs.
  std::vector<std::pair<int64_t, std::pair<double, double>>> bf16_rows;
  for (int64_t bytes : {int64_t{1} << 20, int64_t{16} << 20}) {
    if (bytes > max_bytes) continue;
    auto f32 = torch::rand({bytes / 2});
    auto bf16 = torch::rand({bytes / 2}).to(torch::kBFloat16);
    const int iters = static_cast<int>(std::clamp<int64_t>((int64_t{8} << 20) / bytes, 1, 50));
    auto times = measure(*world, {[&] { world->all_reduce(bf16); }, [&] { world->all_reduce(f32); }}, iters, blocks);
    bf16_rows.push_back({bytes / 2, {times.seconds[0], times.seconds[1]}});
  }
  if (main) {
    std::printf("\nreduce_scatter algorithms in the facade (input size shown)\n");
    std::printf("%8s %11s %14s %12s %16s\n", "size", "ring ms", "ar+slice ms", native_rs ? "native ms" : "",
                "ring vs ar+slice");
    for (const auto& [bytes, t] : ring_vs_slice) {
      char native[32] = "";
      if (native_rs) std::snprintf(native, sizeof(native), "%.3f", t[2] * 1e3);
      std::printf("%8s %11.3f %14.3f %12s %15.2fx\n", human(bytes).c_str(), t[0] * 1e3, t[1] * 1e3, native,
                  t[1] / t[0]);
    }
    if (native_ag) {
      std::printf("\nall_gather_into_tensor algorithms in the facade (output size shown)\n");
      std::printf("%8s %11s %11s %16s\n", "size", "ring ms", "native ms", "native vs ring");
      for (const auto& [bytes, t] : gather_algorithms) {
        std::printf("%8s %11.3f %11.3f %15.2fx\n", human(bytes).c_str(), t[0] * 1e3, t[1] * 1e3, t[0] / t[1]);
      }
    }
    std::printf("\nall_reduce of N elements: bfloat16 (%s) vs float32\n",
                lockstep::compat::gloo_capabilities().reduces_bfloat16 ? "native in Gloo"
                                                                         : "reduced in float32 by the facade");
    std::printf("%10s %11s %11s %9s\n", "elements", "bf16 ms", "f32 ms", "ratio");
    for (const auto& [elements, t] : bf16_rows) {
      std::printf("%9lldK %11.3f %11.3f %8.2fx\n", static_cast<long long>(elements >> 10), t.first * 1e3,
                  t.second * 1e3, t.first / t.second);
    }
    std::printf("\nfacade overhead at >= 1 MiB (median of the rows): ");
    std::vector<double> overheads;
    for (const auto& row : rows) {
      if (row.bytes >= (1 << 20)) overheads.push_back(row.overhead);
    }
    std::printf("%+.1f%%, worst %+.1f%%\n", overheads.empty() ? 0.0 : median(overheads) * 100,
                overheads.empty() ? 0.0 : *std::max_element(overheads.begin(), overheads.end()) * 100);
    if (raw_wall > 0) {
      std::printf("facade's own cost (calling-thread CPU per 1 MiB all_reduce): facade %.1f us, raw %.1f us; "
                  "the difference is %.2f%% of the raw call's %.3f ms\n",
                  facade_cpu * 1e6, raw_cpu * 1e6, (facade_cpu - raw_cpu) / raw_wall * 100, raw_wall * 1e3);
    }
  }
  lockstep::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  if (std::getenv("RANK") != nullptr) return run_benchmark();
  // Not under a launcher: start two copies of this program through it.
  std::vector<std::string> command(argv, argv + argc);
  command[0] = lockstep::bench::self_path();
  return lockstep::launch(lockstep::LaunchOptions().standalone(true).nproc_per_node(2).command(command));
}
