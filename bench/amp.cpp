// bench/amp: what mixed precision buys per training step, against float32
// measured in the same run.
//
// Two workloads, each trained through lockstep's optim wrappers (the path a
// config takes): the demo's ConvNet on 28x28 images, batch 64, and a
// transformer-style MLP (pre-norm residual blocks of LayerNorm, Linear d->4d,
// GELU, Linear 4d->d over [batch, tokens, d] activations, a classifier head
// per token). Each runs with a plain OptimWrapper (fp32) and an
// AmpOptimWrapper (bf16 autocast, no scaler); on CUDA also with fp16 autocast
// and dynamic loss scaling. CPU autocast has no float16, so fp16 rows say
// "skipped" without a GPU. The modes alternate in rounds so machine noise hits
// them alike; the ratios are of median step times.
//
//   build/bench/bench_amp            # BENCH_ROUNDS=5 BENCH_ITERS=20 BENCH_THREADS=1
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "lockstep/amp/amp_optim_wrapper.h"
#include "lockstep/core/logging.h"
#include "lockstep/model/data_preprocessor.h"
#include "lockstep/builtin_models/classifiers.h"

using namespace lockstep;

namespace {

// Pre-norm feed-forward blocks, the MLP half of a transformer layer.
class TokenMLP : public Model {
 public:
  TokenMLP(int64_t dim, int64_t layers, int64_t classes) {
    for (int64_t i = 0; i < layers; ++i) {
      norms_.push_back(register_module("norm" + std::to_string(i), torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}))));
      up_.push_back(register_module("up" + std::to_string(i), torch::nn::Linear(dim, 4 * dim)));
      down_.push_back(register_module("down" + std::to_string(i), torch::nn::Linear(4 * dim, dim)));
    }
    head_ = register_module("head", torch::nn::Linear(dim, classes));
  }
  LossDict loss(const Batch& data) override {
    torch::Tensor x = data.at("x");
    for (size_t i = 0; i < up_.size(); ++i) x = x + down_[i](torch::gelu(up_[i](norms_[i](x))));
    torch::Tensor logits = head_(x);
    LossDict losses;
    losses.insert("loss", torch::nn::functional::cross_entropy(logits.flatten(0, 1), data.at("target").flatten()));
    return losses;
  }
  Batch predict(const Batch& data) override { return {}; }

 private:
  std::vector<torch::nn::LayerNorm> norms_;
  std::vector<torch::nn::Linear> up_, down_;
  torch::nn::Linear head_{nullptr};
};

struct Workload {
  std::string key;  // for RESULT lines
  std::string name;
  std::function<std::shared_ptr<Model>()> make_model;
  Batch batch;
};

struct Mode {
  std::string name;
  torch::Device device;
  std::optional<torch::ScalarType> amp_dtype;  // nullopt: fp32
};

std::shared_ptr<OptimWrapper> make_wrapper(Model& model, const Mode& mode) {
  auto sgd = std::make_shared<torch::optim::SGD>(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  if (!mode.amp_dtype) return std::make_shared<OptimWrapper>(sgd);
  // fp16 gets dynamic loss scaling by default; bf16 runs without a scaler.
  return std::make_shared<AmpOptimWrapper>(sgd, OptimWrapperOptions(), AmpOptions().dtype(*mode.amp_dtype));
}

// Seconds per train_step (forward under the wrapper's context, backward,
// optimizer step); train_step reads the loss back, which synchronises CUDA.
// The CUDA caching allocator's peak per mode (the last round's), for the table.
std::map<std::string, double> cuda_peaks_mib;

double seconds_per_step(const Workload& workload, const Mode& mode, int64_t iters) {
  if (mode.device.is_cuda()) bench::reset_cuda_peak(0);
  torch::manual_seed(0);
  auto model = workload.make_model();
  model->move_to(mode.device);
  model->train();
  auto optim = make_wrapper(*model, mode);
  double start = 0;
  for (int64_t i = 0; i < iters + 3; ++i) {
    if (i == 3) start = bench::now_seconds();  // warm-up (oneDNN / cuDNN plans) excluded
    model->train_step(workload.batch, *optim);
  }
  const double seconds = (bench::now_seconds() - start) / static_cast<double>(iters);
  if (mode.device.is_cuda()) cuda_peaks_mib[mode.name] = bench::cuda_peak_mib(0);
  return seconds;
}

}  // namespace

int main() {
  const long rounds = bench::env_int("BENCH_ROUNDS", 5);
  const long iters = bench::env_int("BENCH_ITERS", 20);
  torch::set_num_threads(static_cast<int>(bench::env_int("BENCH_THREADS", 1)));
  spdlog::set_level(spdlog::level::warn);
  logger().set_level(spdlog::level::warn);

  torch::manual_seed(0);
  std::vector<Workload> workloads;
  workloads.push_back({"convnet", "ConvNet [32, 64] + FC 128, batch 64x1x28x28",
                       [] {
                         auto model = std::make_shared<ConvNet>();
                         model->set_data_preprocessor(std::make_shared<ImgDataPreprocessor>(
                             std::vector<double>{72.94}, std::vector<double>{90.02}));
                         return std::static_pointer_cast<Model>(model);
                       },
                       Batch{{"image", torch::randint(0, 256, {64, 1, 28, 28}, torch::kUInt8)},
                             {"label", torch::randint(0, 10, {64})}}});
  workloads.push_back({"token_mlp", "token MLP: 4 x (LN, 256->1024, GELU, 1024->256), 16x64 tokens, 512 classes",
                       [] { return std::static_pointer_cast<Model>(std::make_shared<TokenMLP>(256, 4, 512)); },
                       Batch{{"x", torch::randn({16, 64, 256})}, {"target", torch::randint(0, 512, {16, 64})}}});

  std::vector<Mode> modes{{"fp32", torch::kCPU, std::nullopt}, {"bf16", torch::kCPU, torch::kBFloat16}};
  const bool cuda = torch::cuda::is_available();
  if (cuda) {
    modes.push_back({"cuda fp32", torch::kCUDA, std::nullopt});
    modes.push_back({"cuda bf16", torch::kCUDA, torch::kBFloat16});
    modes.push_back({"cuda fp16", torch::kCUDA, torch::kHalf});
  }
  std::printf("amp: fp32 vs autocast step time (SGD, train_step through OptimWrapper/AmpOptimWrapper), "
              "%ld rounds x %ld steps, %d torch thread(s)\n",
              rounds, iters, torch::get_num_threads());
  if (!cuda) std::printf("fp16: skipped (no CUDA device; CPU autocast has no float16)\n");

  for (const auto& workload : workloads) {
    std::printf("%s\n", workload.name.c_str());
    std::map<std::string, std::vector<double>> times;
    for (long round = 0; round < rounds; ++round) {
      for (const auto& mode : modes) times[mode.name].push_back(seconds_per_step(workload, mode, iters));
    }
    // Each mode against float32 on its own device.
    for (const auto& mode : modes) {
      const std::string baseline = mode.device.is_cuda() ? "cuda fp32" : "fp32";
      const double median = bench::median(times[mode.name]);
      const double base = bench::median(times[baseline]);
      std::printf("  %-10s %8.2f ms/step   x%.2f vs %s", mode.name.c_str(), median * 1e3, base / median,
                  baseline.c_str());
      if (mode.device.is_cuda()) std::printf("   CUDA peak %.1f MiB", cuda_peaks_mib[mode.name]);
      std::printf("\n");
    }
    for (const auto& mode : modes) {
      if (!mode.amp_dtype) continue;
      const std::string baseline = mode.device.is_cuda() ? "cuda fp32" : "fp32";
      std::printf("RESULT amp speedup (%s over %s step time) [%s] = %.3f\n", mode.name.c_str(), baseline.c_str(),
                  workload.key.c_str(),
                  bench::median(times[baseline]) / bench::median(times[mode.name]));
    }
  }
  return 0;
}
