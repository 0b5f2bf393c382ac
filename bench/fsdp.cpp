// bench/fsdp: memory and step time of FSDP's sharding strategies against DDP.
//
// A decoder-only transformer of ~100M parameters (examples/gpt/gpt_model.h:
// 14 blocks, 768 wide), Adam, Gloo on CPU, one torch thread per rank, a small
// batch per rank (the bench measures memory and the cost of sharding, not
// throughput). For world 2 and 4 it launches, one after another:
//   DDP            - lockstep DDP (gradients as bucket views)
//   FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, and HYBRID_SHARD (2 "nodes" x 2, world 4)
//                  - FullyShardedDataParallel, one unit per block, prefetch pre
//   FULLY_SHARD    - FSDP2: FullyShard's per-parameter sharding, FULL_SHARD, one unit per block
//   FULLY_SHARD_LEAN - the same, lean as FULL_SHARD_LEAN below
//   FULL_SHARD_LEAN - FULL_SHARD with backward_prefetch none and
//                     overlap_reductions false: the least memory
// and prints, per mode, the largest value over the ranks of:
//   params / grads / optim  - peak bytes held by parameters, gradients and
//                             optimizer state; total - the peak of their sum at
//                             one moment. Tracked: FSDP counts every gather,
//                             free and reduction it makes (memory_stats());
//                             DDP's are measured after every backward, when all
//                             three are alive (unique storages, so bucket views
//                             count once)
//   VmHWM                   - the process's resident high-water mark (with
//                             BENCH_DEVICE=cuda, one GPU per rank over NCCL:
//                             the CUDA caching allocator's peak instead)
//   step                    - median step time after a warm-up step
// and the targets for FULL_SHARD (and its lean form): total <= DDP's / N
// + the two largest gathered units, and step <= 1.5 x DDP's at world 2.
// Where /usr/bin/python3 has torch 2.x (Debian trixie's root,
// scripts/trixie-root.sh), PyTorch's own FSDP runs the same model too
// (bench/fsdp_peer.py, started by lockstep's launcher), and the ratios of
// lockstep's FULL_SHARD to it (step time, VmHWM, optimizer state) are printed;
// where it has fully_shard (2.6 on), PyTorch's FSDP2 runs too, against
// FULLY_SHARD, whose total is held to issue 60's bound: DDP's total / N plus
// the largest unit, plus 5%.
// Then, at world 2, activation checkpointing (examples/gpt's blocks, DDP):
//   DDP_ACT, DDP_ACT_CKPT   - DDP without and with `activation_checkpointing:
//                             {module_types: [Block]}`, on BENCH_ACTIVATION_TOKENS
//                             (256) tokens per rank (4 sequences of 64): the
//                             rise of the resident set over a forward pass
//                             whose graph is kept, i.e. the activations saved
//                             for backward (allocations of 64 KiB and up go to
//                             mmap, so the resident set follows live tensors),
//                             and the step time.
//                             BENCH_ACTIVATION=0 skips them.
//
// Then, for each world, the memory of building and wrapping the model (see
// build_worker): built whole, and unit by unit (shard_when_built), with the
// ratio of the latter's peak to model/N + one unit + the root.
//
//   build/bench/bench_fsdp                       # BENCH_STEPS=3 BENCH_TOKENS=64 BENCH_WORLDS=2,4 (or none)
//   BENCH_MODES=FULLY_SHARD build/bench/bench_fsdp   # only these modes besides DDP (comma-separated)
//   BENCH_PARTS=build build/bench/bench_fsdp     # only some parts: steps, build, activation
//   bin/lockstep run --standalone --nproc-per-node 2 -- build/bench/bench_fsdp worker FULL_SHARD 3
#include <torch/torch.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "bench/bench_util.h"
#include "examples/gpt/gpt_model.h"
#include "lockstep/core/process_memory.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/model/activation_checkpoint.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/optimizer_state.h"
#include "lockstep/parallel/ddp/distributed_data_parallel.h"
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"
#include "tests/support/test_support.h"

using namespace lockstep;

namespace {

constexpr int kWarmup = 1;

gpt::GPTOptions bench_model() {
  return gpt::GPTOptions().vocab_size(96).block_size(64).n_layer(14).n_head(12).n_embd(768);
}

int64_t vm_hwm_bytes() { return process_memory().peak_rss_bytes; }

int64_t unique_bytes(const std::vector<torch::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

int64_t optimizer_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& entry : save_optimizer_state(optimizer).tensors) {
    bytes += static_cast<int64_t>(entry.second.numel() * entry.second.element_size());
  }
  return bytes;
}

struct Peaks {
  int64_t params = 0, grads = 0, optimizer = 0, total = 0;
};

int worker(const std::string& mode, int steps, int64_t tokens) {
  torch::set_num_threads(1);
  const bool activation_modes = mode == "DDP_ACT" || mode == "DDP_ACT_CKPT";
  // Large blocks from mmap, returned on free: the resident set then follows
  // the live tensors, which is what the activation measurement reads.
  if (activation_modes) mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  const torch::Device device = bench::place_bench_worker();
  init_from_env("auto", device.is_cuda() ? "nccl" : "gloo");
  logger().set_level(spdlog::level::warn);
  torch::manual_seed(0);
  auto model = std::make_shared<gpt::GPT>(bench_model());
  model->move_to(device);
  if (device.is_cuda()) bench::reset_cuda_peak(device.index());
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();

  std::shared_ptr<FullyShardedDataParallel> fsdp;
  std::shared_ptr<OptimWrapper> optim;
  Peaks ddp_peaks;
  StepContext step;  // DDP: measures its peaks after every backward
  std::vector<int64_t> unit_bytes;
  if (mode == "DDP_ACT_CKPT") apply_activation_checkpointing(*model, {"Block"});
  if (mode == "DDP" || activation_modes) {
    auto ddp = std::make_shared<DistributedDataParallel>(
        model, world(), DDPOptions().gradient_as_bucket_view(true).broadcast_buffers(false));
    optim = std::make_shared<OptimWrapper>(std::make_shared<lockstep::Adam>(model->parameters(), 1e-4));
    optim->set_gradient_sync(ddp);
    auto* adam = &optim->optimizer();
    step.after_backward = [&ddp_peaks, model, adam] {
      std::vector<torch::Tensor> params, grads;
      for (const auto& p : model->parameters()) {
        params.push_back(p);
        grads.push_back(p.grad());
      }
      Peaks now{unique_bytes(params), unique_bytes(grads), optimizer_bytes(*adam), 0};
      now.total = now.params + now.grads + now.optimizer;
      ddp_peaks.params = std::max(ddp_peaks.params, now.params);
      ddp_peaks.grads = std::max(ddp_peaks.grads, now.grads);
      ddp_peaks.optimizer = std::max(ddp_peaks.optimizer, now.optimizer);
      ddp_peaks.total = std::max(ddp_peaks.total, now.total);
    };
  } else {
    // FULL_SHARD_LEAN: FULL_SHARD with no prefetch and no reduction overlap.
    // FULLY_SHARD: FSDP2's per-parameter sharding (FullyShard), FULL_SHARD.
    const bool lean = mode == "FULL_SHARD_LEAN" || mode == "FULLY_SHARD_LEAN";
    const bool per_parameter = mode == "FULLY_SHARD" || mode == "FULLY_SHARD_LEAN";
    FSDPOptions options = FSDPOptions()
                              .sharding_strategy(parse_sharding_strategy(lean || per_parameter ? "FULL_SHARD" : mode, "mode"))
                              .per_parameter_sharding(per_parameter)
                              .backward_prefetch(lean ? BackwardPrefetch::kNone : BackwardPrefetch::kPre)
                              .overlap_reductions(!lean)
                              .hybrid_shard_size(2)
                              .auto_wrap_policy(module_type_wrap_policy({"Block"}));
    fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), options);
    for (const auto& unit : fsdp->units()) {
      if (!unit->setup().persistent) unit_bytes.push_back(unit->layout().padded_numel * unit->full().element_size());
    }
    std::vector<torch::Tensor> stepped = fsdp->shard_parameters();
    if (per_parameter) {  // each parameter's rows, as PyTorch's optimizer over fully_shard's DTensors
      stepped.clear();
      for (const auto& [name, param] : fsdp->named_orig_parameters()) stepped.push_back(param);
    }
    auto adam = std::make_shared<lockstep::Adam>(stepped, 1e-4);
    optim = std::make_shared<OptimWrapper>(adam);
    optim->set_gradient_sync(fsdp);
    fsdp->track_optimizer(adam);
  }
  std::sort(unit_bytes.rbegin(), unit_bytes.rend());
  unit_bytes.resize(2, 0);

  torch::manual_seed(get_rank() + 1);
  // More tokens than the model's context come as several sequences.
  const int64_t length = std::min<int64_t>(tokens, bench_model().block_size());
  const int64_t sequences = std::max<int64_t>(1, tokens / length);
  torch::Tensor data = torch::randint(0, 96, {2, sequences, length + 1}, torch::kLong).to(device);
  std::vector<double> times;
  int64_t activation_peak = 0;  // the resident set's rise over a forward pass: what backward will need
  for (int i = 0; i < steps + kWarmup; ++i) {
    torch::Tensor sequence = data[i % 2];
    Batch batch{{"input", sequence.narrow(1, 0, length).contiguous()}, {"target", sequence.narrow(1, 1, length).contiguous()}};
    synchronize();
    const double start = bench::now_seconds();
    model->run_train_step(batch, *optim, step);
    if (i >= kWarmup) times.push_back(bench::now_seconds() - start);
    if (activation_modes && i >= kWarmup) {
      // A forward pass alone, its graph kept until measured: the activations
      // saved for backward (with checkpointing, each block's input only).
      const int64_t resident_before = process_memory().rss_bytes;
      {
        LossDict losses = model->loss(model->data_preprocessor()(batch, /*training=*/true));
        activation_peak = std::max(activation_peak, process_memory().rss_bytes - resident_before);
      }
    }
  }
  Peaks peaks = ddp_peaks;
  if (fsdp) {
    const FSDPMemoryStats stats = fsdp->memory_stats();
    peaks = Peaks{stats.peak_params, stats.peak_grads, stats.peak_optimizer, stats.peak_total};
  }
  // One line per rank, in rank order.
  for (int r = 0; r < get_world_size(); ++r) {
    if (r == get_rank()) {
      std::printf("RESULT %s %d %lld %lld %lld %lld %lld %.6f %lld %lld %lld %lld\n", mode.c_str(), r,
                  static_cast<long long>(peaks.params), static_cast<long long>(peaks.grads),
                  static_cast<long long>(peaks.optimizer), static_cast<long long>(peaks.total),
                  // On a GPU the memory that counts is the device's: the caching allocator's peak.
                  static_cast<long long>(device.is_cuda() ? bench::cuda_peak_mib(device.index()) * 1024 * 1024
                                                          : vm_hwm_bytes()),
                  bench::median(times), static_cast<long long>(unit_bytes[0]),
                  static_cast<long long>(unit_bytes[1]), static_cast<long long>(numel),
                  static_cast<long long>(activation_peak));
      std::fflush(stdout);
    }
    synchronize();
  }
  destroy_process_group();
  return 0;
}

// Construction and wrapping alone (FULL_SHARD over the world, units = blocks):
//   BUILD_WHOLE    the GPT built whole on the host, then wrapped;
//   BUILD_SHARDED  built inside FSDP's ShardWhileBuilding scope: each block
//                  is sharded as its constructor returns (shard_when_built).
// Prints "BUILD mode rank rise model_bytes largest_unit_bytes root_bytes": the
// rise of the resident set's high-water mark over construction and wrapping
// (VmHWM reset first; blocks of 64 KiB and up come from mmap, so freed tensors
// leave the resident set).
int build_worker(const std::string& mode, int64_t n_layer, int64_t n_embd) {
  torch::set_num_threads(1);
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  init_from_env("auto", "gloo");
  logger().set_level(spdlog::level::warn);
  {  // libtorch's first-use allocations (thread pools, generator) before the baseline
    torch::NoGradGuard no_grad;
    torch::Tensor warm = torch::empty({256, 256}).normal_();
    warm = warm.matmul(warm);
  }
  const FSDPOptions options = FSDPOptions().auto_wrap_policy(module_type_wrap_policy({"Block"}));
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
  const int64_t baseline = process_memory().rss_bytes;
  torch::manual_seed(0);
  std::shared_ptr<gpt::GPT> model;
  if (mode == "BUILD_SHARDED") {
    fsdp::ShardWhileBuilding scope(FullyShardedDataParallel::shard_plan(options, world(), torch::kCPU));
    model = std::make_shared<gpt::GPT>(bench_model().n_layer(n_layer).n_embd(n_embd));
  } else {
    model = std::make_shared<gpt::GPT>(bench_model().n_layer(n_layer).n_embd(n_embd));
  }
  auto fsdp = std::make_shared<FullyShardedDataParallel>(model, world(), options);
  const int64_t rise = process_memory().peak_rss_bytes - baseline;
  int64_t model_bytes = 0, largest = 0, root = 0;
  for (const auto& unit : fsdp->units()) {
    const int64_t bytes = unit->layout().numel * static_cast<int64_t>(sizeof(float));
    model_bytes += bytes;
    if (unit->path().empty()) {
      root = bytes;
    } else {
      largest = std::max(largest, bytes);
    }
  }
  std::printf("BUILD %s %d %lld %lld %lld %lld\n", mode.c_str(), get_rank(), static_cast<long long>(rise),
              static_cast<long long>(model_bytes), static_cast<long long>(largest), static_cast<long long>(root));
  std::fflush(stdout);
  fsdp.reset();
  destroy_process_group();
  return 0;
}

// The fields after `tag` (and the mode and rank) of each rank's result line,
// e.g. "RESULT FULL_SHARD 1 ..." -> the stream after "1"; exits naming `what`
// and showing the output when no rank printed one.
std::vector<std::istringstream> rank_lines(const testing::CommandResult& output, const std::string& tag,
                                           const std::string& what) {
  std::vector<std::istringstream> found;
  std::istringstream lines(output.output);
  std::string line;
  while (std::getline(lines, line)) {
    const auto at = line.find(tag + " ");
    if (at == std::string::npos) continue;
    std::istringstream fields(line.substr(at + tag.size() + 1));
    std::string mode;
    int rank = 0;
    if (fields >> mode >> rank) found.push_back(std::move(fields));
  }
  if (found.empty()) {
    std::fprintf(stderr, "%s produced no result (exit %d):\n%s\n", what.c_str(), output.exit_code, output.output.c_str());
    std::exit(1);
  }
  return found;
}

struct BuildResult {
  int64_t rise = 0, model = 0, unit = 0, root = 0;
};

// The largest rise over the ranks.
BuildResult parse_build(const testing::CommandResult& output, const std::string& what) {
  BuildResult result;
  for (auto& fields : rank_lines(output, "BUILD", what)) {
    long long rise = 0, model = 0, unit = 0, root = 0;
    fields >> rise >> model >> unit >> root;
    result = BuildResult{std::max<int64_t>(result.rise, rise), model, unit, root};
  }
  return result;
}

struct Result {
  int64_t params = 0, grads = 0, optimizer = 0, total = 0, hwm = 0, unit1 = 0, unit2 = 0, numel = 0, activation = 0;
  double step = 0;
};

// The largest value of each column over the ranks.
Result parse(const testing::CommandResult& output, const std::string& what) {
  Result result;
  for (auto& fields : rank_lines(output, "RESULT", what)) {
    long long params = 0, grads = 0, optimizer = 0, total = 0, hwm = 0, unit1 = 0, unit2 = 0, numel = 0, activation = 0;
    double step = 0;
    fields >> params >> grads >> optimizer >> total >> hwm >> step >> unit1 >> unit2 >> numel >> activation;
    result.activation = std::max<int64_t>(result.activation, activation);
    result.params = std::max<int64_t>(result.params, params);
    result.grads = std::max<int64_t>(result.grads, grads);
    result.optimizer = std::max<int64_t>(result.optimizer, optimizer);
    result.total = std::max<int64_t>(result.total, total);
    result.hwm = std::max<int64_t>(result.hwm, hwm);
    result.step = std::max(result.step, step);
    result.unit1 = unit1;
    result.unit2 = unit2;
    result.numel = numel;
  }
  return result;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

int driver() {
  const int steps = static_cast<int>(bench::env_int("BENCH_STEPS", 3));
  const int64_t tokens = bench::env_int("BENCH_TOKENS", 64);
  const char* worlds_env = std::getenv("BENCH_WORLDS");
  const std::string worlds_text = worlds_env != nullptr && *worlds_env != '\0' ? worlds_env : "2,4";
  const std::string launcher = std::string(LOCKSTEP_BINARY_DIR) + "/bin/lockstep";
  const std::string self = bench::self_path();
  const bool cuda = bench::bench_device_name() != "cpu";
  std::printf("bench/fsdp: GPT 14 x 768 (vocab 96), Adam, %s, 1 torch thread per rank, 1 sequence of %lld "
              "tokens per rank; %d warm-up + %d timed steps per mode\n",
              cuda ? "NCCL, one GPU each" : "Gloo, CPU", static_cast<long long>(tokens), kWarmup, steps);
  std::istringstream worlds(worlds_text);
  std::string world_text;
  // BENCH_PARTS: any of steps, build, activation (default all three).
  const char* parts_env = std::getenv("BENCH_PARTS");
  const std::string parts = parts_env != nullptr && *parts_env != '\0' ? parts_env : "steps,build,activation";
  auto part = [&parts](const std::string& name) { return parts.find(name) != std::string::npos; };
  // PyTorch's FSDP runs where the machine's Python has torch 2.x (1.13's does not import on Python 3.11).
  const bool pytorch_fsdp =
      !cuda && testing::run_command({"/usr/bin/python3", "-c",
                                     "import sys, torch, torch.distributed.fsdp; "
                                     "sys.exit(int(torch.__version__.split('.')[0]) < 2)"},
                                    {}, 120)
                       .exit_code == 0;
  std::printf("PyTorch's FSDP: %s\n", pytorch_fsdp ? "compared (bench/fsdp_peer.py)"
                                                    : "not compared (no torch 2.x for /usr/bin/python3, or CUDA)");
  // And its FSDP2 where it has a public fully_shard (2.6 on).
  const bool pytorch_fully_shard =
      pytorch_fsdp && testing::run_command({"/usr/bin/python3", "-c", "from torch.distributed.fsdp import fully_shard"},
                                           {}, 120)
                              .exit_code == 0;
  std::printf("PyTorch's fully_shard: %s\n", pytorch_fully_shard ? "compared (bench/fsdp_peer.py fully_shard)"
                                                                  : "not compared");
  // BENCH_MODES: only these of lockstep's modes (DDP is always run: the tables divide by it).
  const char* modes_env = std::getenv("BENCH_MODES");
  const std::string wanted_modes = modes_env != nullptr && *modes_env != '\0' ? modes_env : "";
  auto wanted = [&wanted_modes](const std::string& mode) {
    return wanted_modes.empty() || mode == "DDP" || ("," + wanted_modes + ",").find("," + mode + ",") != std::string::npos;
  };
  while (part("steps") && worlds_text != "none" && std::getline(worlds, world_text, ',')) {
    const int world_size = std::stoi(world_text);
    std::vector<std::string> all_modes{"DDP",      "FULL_SHARD",  "FULL_SHARD_LEAN",  "SHARD_GRAD_OP",
                                       "NO_SHARD", "FULLY_SHARD", "FULLY_SHARD_LEAN"};
    if (world_size % 2 == 0 && world_size > 2) all_modes.push_back("HYBRID_SHARD");
    std::vector<std::string> modes;
    for (const auto& mode : all_modes) {
      if (wanted(mode)) modes.push_back(mode);
    }
    std::map<std::string, Result> results;
    for (const auto& mode : modes) {
      auto output = testing::run_command({launcher, "run", "--standalone", "--nproc-per-node", std::to_string(world_size),
                                          "--", self, "worker", mode, std::to_string(steps), std::to_string(tokens)},
                                         {}, 1800);
      results[mode] = parse(output, mode + " on " + std::to_string(world_size) + " ranks");
    }
    // PyTorch's own FSDP (and FSDP2) on the same model, started by the same launcher (bench/fsdp_peer.py).
    auto run_peer = [&](const std::string& name, const std::string& variant) {
      std::vector<std::string> command{launcher, "run", "--standalone", "--nproc-per-node", std::to_string(world_size),
                                       "--", "/usr/bin/python3", std::string(LOCKSTEP_SOURCE_DIR) + "/bench/fsdp_peer.py",
                                       std::to_string(steps), std::to_string(tokens)};
      if (!variant.empty()) command.push_back(variant);
      results[name] = parse(testing::run_command(command, {}, 1800), name + " on " + std::to_string(world_size) + " ranks");
      modes.push_back(name);
    };
    if (pytorch_fsdp && results.count("FULL_SHARD")) run_peer("PYTORCH_FSDP", "");
    if (pytorch_fully_shard && results.count("FULLY_SHARD")) run_peer("PYTORCH_FULLY_SHARD", "fully_shard");
    const Result& ddp = results["DDP"];
    std::printf("\nworld %d, %lld parameters (MiB; largest over ranks)\n", world_size,
                static_cast<long long>(ddp.numel));
    std::printf("| mode | params peak | grads peak | optim peak | total peak | total / DDP | %s | step | step / DDP |\n"
                "|---|---|---|---|---|---|---|---|---|\n",
                cuda ? "CUDA peak" : "VmHWM");
    for (const auto& mode : modes) {
      const Result& r = results[mode];
      if (mode.rfind("PYTORCH_", 0) == 0) {  // PyTorch tracks no parameter or gradient bytes
        std::printf("| %s | - | - | %.1f | - | - | %.1f | %.3f s | %.2f |\n",
                    mode == "PYTORCH_FSDP" ? "PyTorch FSDP FULL_SHARD" : "PyTorch fully_shard", mib(r.optimizer),
                    mib(r.hwm), r.step, r.step / ddp.step);
        continue;
      }
      std::printf("| %s | %.1f | %.1f | %.1f | %.1f | %.3f | %.1f | %.3f s | %.2f |\n", mode.c_str(), mib(r.params),
                  mib(r.grads), mib(r.optimizer), mib(r.total), static_cast<double>(r.total) / ddp.total, mib(r.hwm),
                  r.step, r.step / ddp.step);
    }
    // lockstep's mode against PyTorch's, as "ratio <what>_step_vs_pytorch_<what>_world<N> x" lines.
    auto print_ratios = [&](const char* what, const std::string& ours_mode, const std::string& theirs_mode) {
      if (!results.count(theirs_mode)) return;
      const Result& ours = results[ours_mode];
      const Result& theirs = results[theirs_mode];
      const std::pair<const char*, double> ratios[] = {
          {"step", ours.step / theirs.step},
          {"peak_rss", static_cast<double>(ours.hwm) / theirs.hwm},
          {"optimizer", static_cast<double>(ours.optimizer) / theirs.optimizer}};
      for (const auto& [column, ratio] : ratios) {
        std::printf("ratio %s_%s_vs_pytorch_%s_world%d %.3f\n", what, column, what, world_size, ratio);
      }
    };
    print_ratios("fully_shard", "FULLY_SHARD", "PYTORCH_FULLY_SHARD");
    for (const char* name : {"FULLY_SHARD", "FULLY_SHARD_LEAN"}) {
      if (!results.count(name)) continue;
      // Issue 60's bound: 1/N of the model (DDP's parameters, gradients and
      // optimizer state) plus its largest unit, plus 5%.
      const Result& fsdp2 = results[name];
      const double bound = (static_cast<double>(ddp.total) / world_size + fsdp2.unit1) * 1.05;
      std::printf("%s total peak %.1f MiB vs (DDP/%d + largest unit) x 1.05 = (%.1f + %.1f) x 1.05 = %.1f MiB: "
                  "ratio %.3f (target <= 1)\n",
                  name, mib(fsdp2.total), world_size, mib(ddp.total) / world_size, mib(fsdp2.unit1), bound / (1 << 20),
                  fsdp2.total / bound);
    }
    print_ratios("fsdp", "FULL_SHARD", "PYTORCH_FSDP");
    for (const char* name : {"FULL_SHARD", "FULL_SHARD_LEAN"}) {
      if (!results.count(name)) continue;
      const Result& full = results[name];
      const double bound = static_cast<double>(ddp.total) / world_size + full.unit1 + full.unit2;
      std::printf("%s total peak %.1f MiB vs DDP/%d + two largest units (%.1f + %.1f + %.1f) = %.1f MiB: "
                  "ratio %.3f (target <= 1); step / DDP step = %.2f (target <= 1.5 at world 2)\n",
                  name, mib(full.total), world_size, mib(ddp.total) / world_size, mib(full.unit1), mib(full.unit2),
                  bound / (1 << 20), full.total / bound, full.step / ddp.step);
    }
  }
  std::istringstream build_worlds(worlds_text);
  while (part("build") && worlds_text != "none" && std::getline(build_worlds, world_text, ',')) {
    const int world_size = std::stoi(world_text);
    auto build = [&](const std::string& mode, int64_t n_layer, int64_t n_embd) {
      auto output = testing::run_command({launcher, "run", "--standalone", "--nproc-per-node", std::to_string(world_size),
                                          "--", self, "build", mode, std::to_string(n_layer), std::to_string(n_embd)},
                                         {}, 1800);
      return parse_build(output, mode + " on " + std::to_string(world_size) + " ranks");
    };
    const BuildResult whole = build("BUILD_WHOLE", 14, 768);
    const BuildResult sharded = build("BUILD_SHARDED", 14, 768);
    // What wrapping costs whatever the model (process groups, Gloo's buffers):
    // the same with a GPT of one block 96 wide, less that model's own bound.
    const BuildResult tiny = build("BUILD_SHARDED", 1, 96);
    auto bound_of = [world_size](const BuildResult& r) {
      return static_cast<double>(r.model) / world_size + r.unit + r.root;
    };
    const double bound = bound_of(whole);
    const double fixed = std::max(0.0, tiny.rise - bound_of(tiny));
    std::printf("\nconstruction and wrapping, FULL_SHARD on %d ranks: peak resident rise per rank (largest over ranks); "
                "model %.1f MiB, largest unit %.1f MiB, root %.1f MiB; bound = model/%d + unit + root = %.1f MiB; "
                "fixed cost of wrapping %.1f MiB\n"
                "| how the model is built | peak rise | / model | / bound | (rise - fixed) / bound |\n|---|---|---|---|---|\n",
                world_size, mib(whole.model), mib(whole.unit), mib(whole.root), world_size, bound / (1 << 20),
                fixed / (1 << 20));
    for (const auto& [name, r] : {std::make_pair("whole, then wrapped", whole),
                                  std::make_pair("unit by unit (shard_when_built)", sharded)}) {
      std::printf("| %s | %.1f MiB | %.3f | %.3f | %.3f |\n", name, mib(r.rise), static_cast<double>(r.rise) / r.model,
                  r.rise / bound, (r.rise - fixed) / bound);
    }
    std::printf("ratio construction_peak_sharded_vs_bound_world%d %.3f\n", world_size, (sharded.rise - fixed) / bound);
  }
  if (part("activation") && bench::env_int("BENCH_ACTIVATION", 1) != 0) {
    const int64_t activation_tokens = bench::env_int("BENCH_ACTIVATION_TOKENS", 256);
    std::map<std::string, Result> results;
    for (const std::string mode : {"DDP_ACT", "DDP_ACT_CKPT"}) {
      auto output = testing::run_command({launcher, "run", "--standalone", "--nproc-per-node", "2", "--", self, "worker",
                                          mode, std::to_string(steps), std::to_string(activation_tokens)},
                                         {}, 1800);
      results[mode] = parse(output, mode + " on 2 ranks");
    }
    const Result& plain = results["DDP_ACT"];
    const Result& checkpointed = results["DDP_ACT_CKPT"];
    std::printf("\nactivation checkpointing, DDP on 2 ranks, %lld tokens per rank (examples/gpt blocks; largest over "
                "ranks)\n", static_cast<long long>(activation_tokens));
    std::printf(
                "| mode | activations kept for backward (resident rise over forward) | step |\n|---|---|---|\n"
                "| without | %.1f MiB | %.3f s |\n| activation_checkpointing: {module_types: [Block]} | %.1f MiB | %.3f s |\n",
                mib(plain.activation), plain.step, mib(checkpointed.activation), checkpointed.step);
    std::printf("ratio activation_memory_ckpt_vs_plain %.3f\nratio step_time_ckpt_vs_plain %.3f\n",
                static_cast<double>(checkpointed.activation) / plain.activation, checkpointed.step / plain.step);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 5 && std::string(argv[1]) == "worker") return worker(argv[2], std::stoi(argv[3]), std::stoll(argv[4]));
    if (argc >= 5 && std::string(argv[1]) == "build") return build_worker(argv[2], std::stoll(argv[3]), std::stoll(argv[4]));
    return driver();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_fsdp: %s\n", error.what());
    return 1;
  }
}
