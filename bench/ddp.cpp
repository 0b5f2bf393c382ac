// bench/ddp: lockstep's DDP against its limits and against PyTorch's DDP.
//
// Two ranks, Gloo, CPU, one torch thread per rank, batch 64 per rank, SGD with
// momentum, for a CNN (~1.2M parameters) and an MLP (~10M). For each model it
// runs, alternating in rounds:
//   lockstep  - lockstep DDP (buckets overlapped with backward, gradient_as_bucket_view)
//   after     - lockstep with one all_reduce of all gradients after backward (no overlap)
//   none      - the same two processes training with no communication (the limit)
//   pytorch   - torch.nn.parallel.DistributedDataParallel from Debian's python3-torch,
//               on the same libtorch (gradient_as_bucket_view=True)
// and prints median step times and the ratios the DDP issue asks for, with
// every round's ratio (PyTorch goes first in every other round).
//
// With BENCH_DEVICE=cuda each rank trains on its GPU (cuda:LOCAL_RANK) over
// NCCL, PyTorch's DDP too, and rank 0 reports the CUDA caching allocator's peak.
//
//   build/bench/bench_ddp                      # BENCH_ROUNDS=5 BENCH_ITERS=40 BENCH_DEVICE=cpu
//   bin/lockstep run --standalone --nproc-per-node 2 -- build/bench/bench_ddp worker lockstep cnn 40
#include <torch/csrc/utils/tensor_flatten.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "bench/bench_util.h"
#include "bench/ddp_models.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/ddp/distributed_data_parallel.h"
#include "tests/support/test_support.h"

using namespace lockstep;

namespace {

constexpr int64_t kBatch = 64;
constexpr int kWarmup = 5;

// One all_reduce of every gradient once backward is over: what people write
// when they have no DDP.
struct AllReduceAfterBackward : GradientSync {
  explicit AllReduceAfterBackward(torch::nn::Module& module) : params(module.parameters()) {}
  void begin_forward(bool) override {}
  void begin_backward(const torch::Tensor&, bool, int64_t) override {}
  void end_backward(bool sync) override {
    if (!sync) return;
    std::vector<torch::Tensor> grads;
    for (auto& p : params) grads.push_back(p.grad());
    torch::Tensor flat = torch::utils::flatten_dense_tensors(grads);
    world()->all_reduce(flat, ReduceOp::kAvg);
    auto parts = torch::utils::unflatten_dense_tensors(flat, grads);
    for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(parts[i]);
  }
  std::vector<torch::Tensor> params;
};

int worker(const std::string& mode, const std::string& model_name, int iters) {
  torch::set_num_threads(1);
  const torch::Device device = bench::place_bench_worker();
  init_from_env("auto", device.is_cuda() ? "nccl" : "gloo");
  logger().set_level(spdlog::level::warn);
  torch::manual_seed(0);
  auto model = bench::make_bench_model(model_name);
  model->move_to(device);
  if (device.is_cuda()) bench::reset_cuda_peak(device.index());
  auto optim = std::make_shared<OptimWrapper>(
      std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)));
  if (mode == "lockstep") {
    optim->set_gradient_sync(std::make_shared<DistributedDataParallel>(
        model, world(), DDPOptions().gradient_as_bucket_view(true).broadcast_buffers(false)));
  } else if (mode == "after") {
    optim->set_gradient_sync(std::make_shared<AllReduceAfterBackward>(*model));
  } else if (mode != "none") {
    LOCKSTEP_FAIL("unknown mode ", mode);
  }
  const double seconds = bench::median_step_seconds(*model, *optim, kBatch, iters, kWarmup, device);
  if (get_rank() == 0) {
    std::printf("RESULT %s %s %.9f\n", mode.c_str(), model_name.c_str(), seconds);
    if (device.is_cuda()) {
      std::printf("CUDA peak: %s %s %.1f MiB\n", mode.c_str(), model_name.c_str(), bench::cuda_peak_mib(device.index()));
    }
  }
  destroy_process_group();
  return 0;
}

// The seconds of the run's RESULT line (bench::result_seconds); exits naming `what` if it printed none.
double parse_result(const testing::CommandResult& result, const std::vector<std::string>& fields,
                    const std::string& what) {
  const double seconds = bench::result_seconds(result.output, fields);
  if (std::isfinite(seconds)) return seconds;
  std::fprintf(stderr, "%s produced no result (exit %d):\n%s\n", what.c_str(), result.exit_code, result.output.c_str());
  std::exit(1);
}

// lockstep's time over `other`'s, round by round (the runs of one round ran
// minutes apart at most).
std::vector<double> lockstep_ratios(std::map<std::string, std::vector<double>>& times, const std::string& other) {
  std::vector<double> ratios;
  for (size_t r = 0; r < times["lockstep"].size() && r < times[other].size(); ++r) {
    ratios.push_back(times["lockstep"][r] / times[other][r]);
  }
  return ratios;
}

int driver() {
  const int rounds = static_cast<int>(bench::env_int("BENCH_ROUNDS", 5));
  const int iters = static_cast<int>(bench::env_int("BENCH_ITERS", 40));
  const std::string self = bench::self_path();
  const std::string source = LOCKSTEP_SOURCE_DIR;
  const std::string launcher = std::string(LOCKSTEP_BINARY_DIR) + "/bin/lockstep";
  const bool have_python = testing::python_has("torch");
  const bool cuda = bench::bench_device_name() != "cpu";
  std::printf("bench/ddp: 2 ranks, %s, 1 torch thread per rank, batch %lld per rank, SGD momentum; "
              "%d rounds x %d steps\n", cuda ? "NCCL, one GPU each" : "Gloo, CPU", static_cast<long long>(kBatch),
              rounds, iters);
  std::map<std::string, std::map<std::string, std::vector<double>>> times;  // model -> mode -> per round
  for (int round = 0; round < rounds; ++round) {
    for (const std::string model : {"cnn", "mlp"}) {
      auto run_lockstep = [&] {
        for (const std::string mode : {"lockstep", "none", "after"}) {
          auto result = testing::run_command({launcher, "run", "--standalone", "--nproc-per-node", "2", "--", self,
                                              "worker", mode, model, std::to_string(iters)}, {}, 900);
          times[model][mode].push_back(parse_result(result, {mode, model}, mode + " " + model));
          auto peak = result.output.find("CUDA peak: ");
          if (round == 0 && peak != std::string::npos) {
            std::printf("  %s\n", result.output.substr(peak, result.output.find('\n', peak) - peak).c_str());
          }
        }
      };
      auto run_pytorch = [&] {
        if (!have_python) return;
        std::vector<std::string> argv = testing::torchrun();
        argv.insert(argv.end(), {"--standalone", "--nproc_per_node", "2", source + "/bench/ddp_peer.py", model,
                                 std::to_string(iters), std::to_string(kWarmup), std::to_string(kBatch), "1"});
        auto result = testing::run_command(argv, {"OMP_NUM_THREADS=1"}, 900);
        times[model]["pytorch"].push_back(parse_result(result, {model}, "pytorch " + model));
      };
      bench::in_alternating_order(round, run_lockstep, run_pytorch);
      std::printf("  round %d %s:", round, model.c_str());
      for (auto& [mode, values] : times[model]) std::printf("  %s %.2f ms", mode.c_str(), values.back() * 1e3);
      std::printf("\n");
    }
  }
  std::printf("\n| model | lockstep DDP | no communication | all-reduce after backward | PyTorch DDP | "
              "lockstep / PyTorch | lockstep / no-comm |\n|---|---|---|---|---|---|---|\n");
  for (const std::string model : {"cnn", "mlp"}) {
    auto& m = times[model];
    // Ratios pair the runs of one round (they ran minutes apart at most), and
    // take the median over rounds: the machine's speed drifts more between
    // rounds than the ratios differ.
    auto paired = [&](const std::string& other) { return bench::median(lockstep_ratios(m, other)); };
    double pytorch = have_python ? bench::median(m["pytorch"]) : 0;
    std::printf("| %s | %.2f ms | %.2f ms | %.2f ms | %s | %s | %.3f |\n", model.c_str(),
                bench::median(m["lockstep"]) * 1e3, bench::median(m["none"]) * 1e3, bench::median(m["after"]) * 1e3,
                have_python ? (std::to_string(pytorch * 1e3).substr(0, 6) + " ms").c_str() : "n/a",
                have_python ? std::to_string(paired("pytorch")).substr(0, 5).c_str() : "n/a", paired("none"));
  }
  std::printf("times: medians over rounds; ratios: median over rounds of the ratio within a round\n");
  // How far the rounds spread: a median ratio means something only where
  // most rounds fall on the same side of the target.
  for (const std::string model : {"cnn", "mlp"}) {
    for (const std::string other : {"pytorch", "none"}) {
      std::vector<double> ratios = lockstep_ratios(times[model], other);
      if (ratios.empty()) continue;
      std::sort(ratios.begin(), ratios.end());
      std::printf("%s lockstep / %s per round, sorted:", model.c_str(), other.c_str());
      for (double ratio : ratios) std::printf(" %.3f", ratio);
      std::printf("\n");
    }
  }
  std::printf("targets: lockstep / PyTorch <= 0.85 on both models; lockstep / no-comm <= 1.10 on the CNN\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::worker_or_driver(argc, argv, "bench_ddp", worker, driver); }
