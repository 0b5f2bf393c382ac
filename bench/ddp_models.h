// The two models of bench/ddp and bench/multihost, identical in the C++ and
// Python runs, and their timed training loop:
//   cnn: conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, 2x2 max-pool, FC 9216->128, ReLU, FC 128->10 (~1.2M params)
//   mlp: 784->2048->2048->2048->10 with ReLU (~10M params)
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/builtin_models/classifiers.h"
#include "lockstep/optim/optim_wrapper.h"

namespace lockstep::bench {

inline std::shared_ptr<ImageClassifier> make_bench_model(const std::string& name) {
  if (name == "cnn") {
    return std::make_shared<ConvNet>(
        ConvNetOptions().channels({32, 64}).hidden(128).batch_norm(false).pooling("after_last"));
  }
  if (name == "mlp") return std::make_shared<MLP>(MLPOptions().hidden({2048, 2048, 2048}));
  LOCKSTEP_FAIL("unknown bench model '", name, "' (cnn or mlp)");
}

// `warmup` untimed steps, then `iters` timed ones, each a train_step on one of
// 8 batches of `batch` random 28x28 images drawn from this rank's seed (on
// `device`); the median seconds per step, once every rank has finished.
inline double median_step_seconds(ImageClassifier& model, OptimWrapper& optim, int64_t batch, int iters, int warmup,
                                  torch::Device device = torch::kCPU) {
  torch::manual_seed(get_rank());
  auto images = torch::randn({8, batch, 1, 28, 28}).to(device);
  auto labels = torch::randint(0, 10, {8, batch}, torch::kLong).to(device);
  optim.initialize_count_status(0, iters + warmup);
  std::vector<double> times;
  for (int i = 0; i < iters + warmup; ++i) {
    const double start = now_seconds();
    model.train_step(Batch{{"image", images[i % 8]}, {"label", labels[i % 8]}}, optim);
    if (i >= warmup) times.push_back(now_seconds() - start);
  }
  synchronize();
  return median(times);
}

}  // namespace lockstep::bench
