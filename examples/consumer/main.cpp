// A program built against an installed lockstep (see CMakeLists.txt): it
// brings its own model, registers it, and trains it for a few iterations on
// lockstep's SyntheticImages through the Runner, then evaluates it.
//
//   consumer WORK_DIR [ITERATIONS]
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "lockstep/config/config.h"
#include "lockstep/config/registry.h"
#include "lockstep/core/error.h"
#include "lockstep/runner/runner.h"
#include "lockstep/model/model.h"

namespace {

class TinyNet : public lockstep::Model {
 public:
  explicit TinyNet(int64_t num_classes) {
    conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    fc_ = register_module("fc", torch::nn::Linear(4 * 8 * 8, num_classes));
  }
  torch::Tensor forward(const torch::Tensor& image) { return fc_(torch::relu(conv_(image)).flatten(1)); }

  lockstep::LossDict loss(const lockstep::Batch& data) override {
    lockstep::LossDict losses;
    losses.insert("loss_cls", torch::nn::functional::cross_entropy(forward(data.at("image")), data.at("label")));
    return losses;
  }
  lockstep::Batch predict(const lockstep::Batch& data) override { return {{"logits", forward(data.at("image"))}}; }

 private:
  torch::nn::Conv2d conv_{nullptr};
  torch::nn::Linear fc_{nullptr};
};

LOCKSTEP_REGISTER(lockstep::model_registry(), "TinyNet", [](const lockstep::Config& config) {
  return std::make_shared<TinyNet>(config.get<int64_t>("num_classes", 4));
});

const char* const kConfig = R"YAML(
randomness: {seed: 0}
model:
  type: TinyNet
  num_classes: 4
  data_preprocessor: {type: ImgDataPreprocessor, mean: [127.5], std: [127.5]}
train_dataloader:
  batch_size: 16
  sampler: {type: DefaultSampler, shuffle: true}
  dataset: {type: SyntheticImages, size: 256, channels: 1, height: 8, width: 8, num_classes: 4, seed: 1}
# The same seed draws the same class patterns; the samples' noise differs.
val_dataloader:
  batch_size: 64
  sampler: {type: DefaultSampler, shuffle: false}
  dataset: {type: SyntheticImages, size: 128, channels: 1, height: 8, width: 8, num_classes: 4, seed: 1}
val_evaluator: {type: Accuracy}
train_cfg: {max_iters: 20, val_interval: 20}
optim_wrapper: {optimizer: {type: SGD, lr: 0.05, momentum: 0.9}}
default_hooks:
  logger: {interval: 5}
  checkpoint: {interval: 20, by_epoch: false}
)YAML";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " WORK_DIR [ITERATIONS]\n";
    return 2;
  }
  try {
    lockstep::Config config = lockstep::parse_config(kConfig, "consumer.yaml");
    if (argc > 2) config.apply_override(std::string("train_cfg.max_iters=") + argv[2]);
    lockstep::Runner runner(config, lockstep::RunnerOptions().work_dir(argv[1]));
    auto metrics = runner.train();
    for (const auto& [name, value] : metrics) std::cout << "consumer: " << name << " = " << value << "\n";
  } catch (const lockstep::Error& error) {
    std::cerr << "consumer: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
