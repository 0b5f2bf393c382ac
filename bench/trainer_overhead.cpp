// bench/trainer_overhead: what lockstep's Trainer costs per step over a
// hand-written libtorch loop doing the same work.
//
// Both train the demo's ConvNet with SGD (momentum) on the same in-memory
// images, batch 64, with the same preprocessing; the Trainer runs with its
// usual company (data loader, OptimWrapper, IterationTimer, LR scheduler hook,
// a JSON-lines writer every 20 iterations). The two alternate in rounds so
// that machine noise hits both alike; the ratio of median step times is the
// overhead.
//
//   build/bench/bench_trainer_overhead            # BENCH_ROUNDS=5 BENCH_ITERS=60 BENCH_THREADS=1
//   BENCH_DEVICE=cuda build/bench/bench_trainer_overhead   # both on GPU 0 (the batch copied there each step)
//
// On a GPU the hand-written loop reads the loss every step (one host
// synchronisation, as such loops do); both timings end with the device
// synchronised, so queued work is counted. There it also counts each side's
// host synchronisations per step (compat::CudaSyncCounter) and prints them in
// a second RESULT line, the most of any round.
//
// Last, one more run of each (BENCH_ITERS steps) counts the ATen operators
// each step calls (bench/op_counter.h: outermost calls, on every thread) and
// prints the count of each, and the operators whose counts differ: on a GPU
// each is a kernel launch, so this says on any machine what the Trainer's
// step launches beyond the hand-written one.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "bench/op_counter.h"
#include "lockstep/compat/cuda.h"
#include "lockstep/core/logging.h"
#include "lockstep/data/data_loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/data/synthetic.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/iteration_timer.h"
#include "lockstep/hooks/lr_scheduler_hook.h"
#include "lockstep/hooks/periodic_writer.h"
#include "lockstep/model/data_preprocessor.h"
#include "lockstep/builtin_models/classifiers.h"
#include "lockstep/events/json_writer.h"

using namespace lockstep;

namespace {

constexpr int64_t kBatch = 64;

std::shared_ptr<ConvNet> make_model(const torch::Device& device) {
  torch::manual_seed(0);
  auto model = std::make_shared<ConvNet>();
  auto preprocessor = std::make_shared<ImgDataPreprocessor>(std::vector<double>{72.94}, std::vector<double>{90.02});
  preprocessor->set_device(device);
  model->set_data_preprocessor(preprocessor);
  model->to(device);
  return model;
}

// The time now, after the device finished what was queued on it.
double settled_now(const torch::Device& device) {
  if (device.is_cuda()) compat::synchronize_cuda(device.index());
  return bench::now_seconds();
}

std::shared_ptr<torch::optim::SGD> make_sgd(torch::nn::Module& model) {
  return std::make_shared<torch::optim::SGD>(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
}

// Seconds per step, and on a GPU the host synchronisations per step
// (compat::CudaSyncCounter; NaN where there is nothing to count).
struct StepCost {
  double seconds = 0;
  double syncs = std::numeric_limits<double>::quiet_NaN();
};

double per_step(const compat::CudaSyncCounter& syncs, int64_t iters) {
  return syncs.counting() ? static_cast<double>(syncs.count()) / static_cast<double>(iters)
                          : std::numeric_limits<double>::quiet_NaN();
}

// A plain libtorch loop: index the batch, preprocess, forward, loss,
// backward, step, and read the loss as a logger would.
StepCost hand_written(const TensorDataset& data, int64_t iters, const torch::Device& device) {
  auto model = make_model(device);
  auto sgd = make_sgd(*model);
  DefaultSampler sampler(data.size(), /*shuffle=*/true, /*seed=*/0);
  std::vector<int64_t> order = sampler.epoch_indices(0);
  auto mean = torch::tensor({72.94f}).view({1, 1, 1, 1}).to(device);
  auto std = torch::tensor({90.02f}).view({1, 1, 1, 1}).to(device);
  double start = 0;
  compat::CudaSyncCounter syncs;
  for (int64_t i = 0; i < iters + 5; ++i) {
    if (i == 5) {  // warm-up excluded
      start = settled_now(device);
      syncs.reset();
    }
    int64_t offset = (i * kBatch) % (static_cast<int64_t>(order.size()) - kBatch);
    std::vector<int64_t> indices(order.begin() + offset, order.begin() + offset + kBatch);
    Batch batch = data.get_batch(indices, 0).to(device, /*non_blocking=*/device.is_cuda());
    torch::Tensor image = (batch.at("image").to(torch::kFloat) - mean) / std;
    sgd->zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(image), batch.at("label"));
    loss.backward();
    sgd->step();
    volatile double value = loss.item<double>();
    (void)value;
  }
  const double syncs_per_step = per_step(syncs, iters);
  return {(settled_now(device) - start) / static_cast<double>(iters), syncs_per_step};
}

StepCost with_trainer(std::shared_ptr<TensorDataset> data, int64_t iters, const std::string& work_dir,
                      const torch::Device& device) {
  auto model = make_model(device);
  auto sampler = std::make_shared<DefaultSampler>(data->size(), true, 0);
  auto loader = std::make_shared<DataLoader>(data, sampler, DataLoaderOptions().batch_size(kBatch).num_workers(0));
  auto optim = std::make_shared<OptimWrapper>(make_sgd(*model));
  Trainer trainer(model, loader, optim);
  auto timer = std::make_shared<IterationTimer>(/*warmup_iters=*/5);
  trainer.register_hooks({timer, std::make_shared<LRSchedulerHook>(optim, SchedulerMap{}),
                          std::make_shared<PeriodicWriter>(
                              std::vector<std::shared_ptr<EventWriter>>{std::make_shared<JsonWriter>(work_dir + "/metrics.jsonl")},
                              20)});
  double start = 0;
  compat::CudaSyncCounter syncs;
  struct StartClock : Hook {
    StartClock(double* start, compat::CudaSyncCounter* syncs, torch::Device device)
        : Hook("StartClock"), start_(start), syncs_(syncs), device_(device) {}
    void before_step() override {
      if (trainer().iter() != 5) return;
      *start_ = settled_now(device_);
      syncs_->reset();
    }
    double* start_;
    compat::CudaSyncCounter* syncs_;
    torch::Device device_;
  };
  trainer.register_hooks({std::make_shared<StartClock>(&start, &syncs, device)});
  trainer.train(0, iters + 5);
  const double syncs_per_step = per_step(syncs, iters);
  return {(settled_now(device) - start) / static_cast<double>(iters), syncs_per_step};
}

}  // namespace

int main() {
  const long rounds = bench::env_int("BENCH_ROUNDS", 5);
  const long iters = bench::env_int("BENCH_ITERS", 60);
  torch::set_num_threads(static_cast<int>(bench::env_int("BENCH_THREADS", 1)));
  torch::Device device = torch::kCPU;
  try {
    device = place_on_device(bench::bench_device_name(), LocalPlace{0, 1}, "BENCH_DEVICE");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_trainer_overhead: %s\n", error.what());
    return 1;
  }
  spdlog::set_level(spdlog::level::warn);
  logger().set_level(spdlog::level::warn);
  auto data = std::make_shared<SyntheticImages>(SyntheticImagesOptions().size(4096));
  std::string work_dir = std::filesystem::temp_directory_path() / "lockstep_bench_trainer";
  std::filesystem::create_directories(work_dir);
  std::vector<double> hand, engine, ratios, hand_syncs, engine_syncs;
  std::printf("trainer_overhead: ConvNet [32, 64] + FC 128, batch %lld, %ld rounds x %ld steps, %d torch thread(s), on %s\n",
              static_cast<long long>(kBatch), rounds, iters, torch::get_num_threads(), device.str().c_str());
  for (long round = 0; round < rounds; ++round) {
    const StepCost hand_cost = hand_written(*data, iters, device);
    const StepCost engine_cost = with_trainer(data, iters, work_dir, device);
    const double a = hand_cost.seconds, b = engine_cost.seconds;
    hand_syncs.push_back(hand_cost.syncs);
    engine_syncs.push_back(engine_cost.syncs);
    hand.push_back(a);
    engine.push_back(b);
    ratios.push_back(b / a);
    std::printf("  round %ld: hand-written %.2f ms/step, lockstep Trainer %.2f ms/step, ratio %.3f\n", round, a * 1e3,
                b * 1e3, b / a);
  }
  std::printf("median: hand-written %.2f ms/step, lockstep Trainer %.2f ms/step\n", bench::median(hand) * 1e3,
              bench::median(engine) * 1e3);
  std::printf("RESULT trainer_overhead ratio (Trainer / hand-written, median of rounds) = %.3f  (target <= 1.03)\n",
              bench::median(ratios));
  if (std::isfinite(engine_syncs.front())) {
    std::printf("RESULT trainer_overhead host synchronisations per step (Note [Counting host synchronisations]): "
                "lockstep Trainer %.2f, hand-written %.2f (goal <= 1)\n",
                *std::max_element(engine_syncs.begin(), engine_syncs.end()),
                *std::max_element(hand_syncs.begin(), hand_syncs.end()));
  }
  // Operators per step, each loop counted alone (warm-up steps included alike).
  std::map<std::string, int64_t> hand_ops, engine_ops;
  {
    bench::OperatorCounter counter;
    hand_written(*data, iters, device);
    hand_ops = counter.counts();
    counter.reset();
    with_trainer(data, iters, work_dir, device);
    engine_ops = counter.counts();
  }
  const double steps = static_cast<double>(iters + 5);
  auto total = [](const std::map<std::string, int64_t>& counts) {
    int64_t sum = 0;
    for (const auto& entry : counts) sum += entry.second;
    return sum;
  };
  std::vector<std::pair<double, std::string>> differences;
  std::map<std::string, int64_t> names = hand_ops;
  names.insert(engine_ops.begin(), engine_ops.end());
  for (const auto& entry : names) {
    const double more = (static_cast<double>(engine_ops[entry.first]) - static_cast<double>(hand_ops[entry.first])) / steps;
    if (std::abs(more) >= 0.05) differences.emplace_back(more, entry.first);
  }
  std::sort(differences.begin(), differences.end(), [](const auto& a, const auto& b) {
    return std::abs(a.first) > std::abs(b.first) || (std::abs(a.first) == std::abs(b.first) && a.second < b.second);
  });
  std::printf("operators per step that differ (lockstep Trainer - hand-written):");
  for (const auto& [more, name] : differences) std::printf(" %s %+.1f;", name.c_str(), more);
  std::printf("\n");
  std::printf("RESULT trainer_overhead ATen operators per step (outermost calls): lockstep Trainer %.1f, "
              "hand-written %.1f\n",
              static_cast<double>(total(engine_ops)) / steps, static_cast<double>(total(hand_ops)) / steps);
  std::filesystem::remove_all(work_dir);
  return 0;
}
