// bench/capi_step: what a training step costs through lockstep's C API
// (lockstep_train_step on the caller's arrays) and through the C++ step API
// (StepTrainer::train_step), against a hand-written libtorch loop doing the
// same work, on the demo's ConvNet.
//
// One process, one torch thread, batch 64 of in-memory images already in the
// caller's float32 array (a simulation's field, or a C program's data): the
// hand-written loop wraps it with torch::from_blob, normalises, runs forward,
// cross-entropy, backward and an SGD-momentum step; the APIs are built from a
// config of the same model, optimizer and preprocessing, with the default
// hooks (logger, no checkpoint). The three are built once and take turns in
// blocks of BENCH_ITERS steps, so that machine noise hits them alike; ratios
// are medians of per-round ratios.
//
//   build/bench/bench_capi_step            # BENCH_ROUNDS=15 BENCH_ITERS=20
#include <torch/torch.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>

#include "bench/bench_util.h"
#include "lockstep/config/config.h"
#include "lockstep/core/logging.h"
#include "lockstep/lockstep.h"
#include "lockstep/model/data_preprocessor.h"
#include "lockstep/builtin_models/classifiers.h"
#include "lockstep/runner/step_trainer.h"

using namespace lockstep;

namespace {

constexpr int64_t kBatch = 64;
constexpr int64_t kWarmup = 5;

const char* const kConfig = R"YAML(
randomness: {seed: 0}
model:
  type: ConvNet
  data_preprocessor: {type: ImgDataPreprocessor, mean: [72.94], std: [90.02]}
optim_wrapper:
  optimizer: {type: SGD, lr: 0.01, momentum: 0.9}
default_hooks:
  logger: {interval: 20}
  checkpoint: {interval: 100000, save_last: false}
)YAML";

// The caller's data: images as float32 pixels and int64 labels, `batches` batches.
struct CallerData {
  std::vector<float> images;
  std::vector<int64_t> labels;
  int64_t batches = 0;
  const float* batch_images(int64_t i) const { return images.data() + (i % batches) * kBatch * 28 * 28; }
  const int64_t* batch_labels(int64_t i) const { return labels.data() + (i % batches) * kBatch; }
};

CallerData make_data(int64_t batches) {
  torch::manual_seed(1);
  CallerData data;
  data.batches = batches;
  torch::Tensor images = torch::randint(0, 256, {batches * kBatch, 1, 28, 28}, torch::kFloat);
  torch::Tensor labels = torch::randint(0, 10, {batches * kBatch}, torch::kLong);
  data.images.assign(images.data_ptr<float>(), images.data_ptr<float>() + images.numel());
  data.labels.assign(labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + labels.numel());
  return data;
}

torch::Tensor images_of(const CallerData& data, int64_t i) {
  return torch::from_blob(const_cast<float*>(data.batch_images(i)), {kBatch, 1, 28, 28}, torch::kFloat);
}
torch::Tensor labels_of(const CallerData& data, int64_t i) {
  return torch::from_blob(const_cast<int64_t*>(data.batch_labels(i)), {kBatch}, torch::kLong);
}

// One way of training, alive for the whole benchmark: step(i) trains on batch i.
struct Contender {
  std::string name;
  std::function<void(int64_t)> step;
  std::vector<double> seconds_per_step;      // wall clock, one entry per round
  std::vector<double> cpu_seconds_per_step;  // CPU time of the whole process, one entry per round
};

double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// The loop a user writes by hand over libtorch.
std::function<void(int64_t)> hand_written(const CallerData& data) {
  torch::manual_seed(0);
  auto model = std::make_shared<ConvNet>();
  auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto mean = torch::tensor({72.94f}).view({1, 1, 1, 1});
  auto std = torch::tensor({90.02f}).view({1, 1, 1, 1});
  return [&data, model, sgd, mean, std](int64_t i) {
    torch::Tensor image = (images_of(data, i) - mean) / std;
    // Gradients set to none, as PyTorch 2's zero_grad() and lockstep do
    // (libtorch 1.13's Optimizer::zero_grad() fills them with zeros instead,
    // about 10% slower here).
    for (auto& parameter : model->parameters()) parameter.mutable_grad() = torch::Tensor();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(image), labels_of(data, i));
    loss.backward();
    sgd->step();
    volatile double value = loss.item<double>();
    (void)value;
  };
}

std::function<void(int64_t)> cpp_api(const CallerData& data, const std::string& work_dir) {
  auto trainer =
      std::make_shared<StepTrainer>(parse_config(kConfig, "bench.yaml"), StepTrainerOptions().work_dir(work_dir));
  return [&data, trainer](int64_t i) {
    LogVars out = trainer->train_step(Batch{{"image", images_of(data, i)}, {"label", labels_of(data, i)}});
    volatile double value = out.at("loss");
    (void)value;
  };
}

void check(lockstep_status status) {
  if (status == LOCKSTEP_OK) return;
  std::fprintf(stderr, "bench_capi_step: %s\n", lockstep_last_error());
  std::exit(1);
}

std::function<void(int64_t)> c_api(const CallerData& data, const std::string& config_path,
                                   const std::string& work_dir) {
  const std::string work = "work_dir=" + work_dir;
  const char* overrides[] = {work.c_str()};
  lockstep_trainer created = nullptr;
  check(lockstep_trainer_create_with(config_path.c_str(), overrides, 1, &created));
  std::shared_ptr<lockstep_trainer_s> trainer(created, [](lockstep_trainer t) { lockstep_trainer_destroy(t); });
  return [&data, trainer](int64_t i) {
    static const int64_t image_shape[4] = {kBatch, 1, 28, 28};
    static const int64_t label_shape[1] = {kBatch};
    lockstep_tensor input{const_cast<float*>(data.batch_images(i)), 4, image_shape, LOCKSTEP_FLOAT32, -1};
    lockstep_tensor target{const_cast<int64_t*>(data.batch_labels(i)), 1, label_shape, LOCKSTEP_INT64, -1};
    double loss = 0;
    check(lockstep_train_step(trainer.get(), &input, &target, &loss));
  };
}

}  // namespace

int main() {
  const long rounds = bench::env_int("BENCH_ROUNDS", 15);
  const long iters = bench::env_int("BENCH_ITERS", 20);
  torch::set_num_threads(1);
  spdlog::set_level(spdlog::level::warn);
  logger().set_level(spdlog::level::warn);
  const CallerData data = make_data(16);
  const std::string work_dir = std::filesystem::temp_directory_path() / "lockstep_bench_capi";
  std::filesystem::create_directories(work_dir);
  const std::string config_path = work_dir + "/bench.yaml";
  { std::FILE* file = std::fopen(config_path.c_str(), "w"); std::fputs(kConfig, file); std::fclose(file); }
  std::printf("capi_step: ConvNet [32, 64] + FC 128, batch %lld, %ld rounds x %ld steps each, 1 torch thread\n",
              static_cast<long long>(kBatch), rounds, iters);
  {
    std::vector<Contender> contenders{{"hand-written", hand_written(data), {}},
                                      {"StepTrainer", cpp_api(data, work_dir + "/cpp"), {}},
                                      {"lockstep_train_step", c_api(data, config_path, work_dir + "/c"), {}}};
    int64_t next_batch = 0;
    for (auto& contender : contenders) {
      for (int64_t i = 0; i < kWarmup; ++i) contender.step(i);
    }
    // All three live side by side and take turns in short blocks, the order
    // rotating each round, so that a slow stretch of the machine hits them alike.
    std::vector<double> cpp_ratio, c_ratio, cpp_cpu_ratio, c_cpu_ratio;
    for (long round = 0; round < rounds; ++round) {
      for (size_t k = 0; k < contenders.size(); ++k) {
        Contender& contender = contenders[(k + static_cast<size_t>(round)) % contenders.size()];
        const double start = bench::now_seconds();
        const double cpu_start = process_cpu_seconds();
        for (long i = 0; i < iters; ++i) contender.step(next_batch + i);
        contender.cpu_seconds_per_step.push_back((process_cpu_seconds() - cpu_start) / static_cast<double>(iters));
        contender.seconds_per_step.push_back((bench::now_seconds() - start) / static_cast<double>(iters));
      }
      next_batch += iters;
      const double a = contenders[0].seconds_per_step.back();
      const double b = contenders[1].seconds_per_step.back();
      const double d = contenders[2].seconds_per_step.back();
      cpp_ratio.push_back(b / a);
      c_ratio.push_back(d / a);
      cpp_cpu_ratio.push_back(contenders[1].cpu_seconds_per_step.back() / contenders[0].cpu_seconds_per_step.back());
      c_cpu_ratio.push_back(contenders[2].cpu_seconds_per_step.back() / contenders[0].cpu_seconds_per_step.back());
      std::printf("  round %ld: hand-written %.2f ms/step, StepTrainer %.2f ms/step (%.3f), lockstep_train_step "
                  "%.2f ms/step (%.3f)\n",
                  round, a * 1e3, b * 1e3, b / a, d * 1e3, d / a);
      std::fflush(stdout);
    }
    std::printf("median: hand-written %.2f ms/step, StepTrainer %.2f ms/step, lockstep_train_step %.2f ms/step\n",
                bench::median(contenders[0].seconds_per_step) * 1e3,
                bench::median(contenders[1].seconds_per_step) * 1e3,
                bench::median(contenders[2].seconds_per_step) * 1e3);
    std::printf(
        "RESULT capi_step ratio (lockstep_train_step / hand-written, median of rounds) = %.3f  (target <= 1.02)\n",
        bench::median(c_ratio));
    std::printf("RESULT capi_step ratio (StepTrainer::train_step / hand-written, median of rounds) = %.3f\n",
                bench::median(cpp_ratio));
    // CPU time is less disturbed by a shared machine's neighbours than wall time.
    std::printf("RESULT capi_step cpu-time ratio (lockstep_train_step / hand-written) = %.3f, "
                "(StepTrainer::train_step / hand-written) = %.3f\n",
                bench::median(c_cpu_ratio), bench::median(cpp_cpu_ratio));
  }
  std::filesystem::remove_all(work_dir);
  return 0;
}
