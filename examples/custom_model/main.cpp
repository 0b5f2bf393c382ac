// A program of your own that trains its own network with lockstep.
//
// It defines a LeNet-style torch::nn::Module as a lockstep::Model, registers
// it under the name "LeNet" so configs can ask for it, and hands the rest
// (data, optimizer, schedules, checkpoints, evaluation, DDP when launched
// with several processes) to lockstep's Runner:
//
//   build/examples/custom_model examples/custom_model/lenet.yaml --set train_cfg.max_epochs=1
//   bin/lockstep run --standalone --nproc-per-node 2 -- build/examples/custom_model \
//       examples/custom_model/lenet.yaml --set strategy.type=DDPStrategy
#include <torch/torch.h>

#include <iostream>

#include "lockstep/config/config.h"
#include "lockstep/config/registry.h"
#include "lockstep/model/model.h"
#include "lockstep/runner/command_line.h"
#include "lockstep/runner/runner.h"
#include "lockstep/strategy/strategy.h"

namespace {

class LeNet : public lockstep::Model {
 public:
  explicit LeNet(int64_t num_classes) {
    conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 5).padding(2)));
    conv2_ = register_module("conv2", torch::nn::Conv2d(6, 16, 5));
    fc1_ = register_module("fc1", torch::nn::Linear(16 * 5 * 5, 120));
    fc2_ = register_module("fc2", torch::nn::Linear(120, 84));
    fc3_ = register_module("fc3", torch::nn::Linear(84, num_classes));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1_(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2_(x)), 2);
    x = torch::relu(fc1_(x.flatten(1)));
    return fc3_(torch::relu(fc2_(x)));
  }

  // Training: named losses. Keys containing "loss" are summed; the rest is logged.
  lockstep::LossDict loss(const lockstep::Batch& data) override {
    torch::Tensor logits = forward(data.at("image"));
    lockstep::LossDict losses;
    losses.insert("loss_cls", torch::nn::functional::cross_entropy(logits, data.at("label")));
    losses.insert("train_acc", logits.argmax(1).eq(data.at("label")).to(torch::kFloat).mean());
    return losses;
  }

  // Evaluation: what the Accuracy metric reads.
  lockstep::Batch predict(const lockstep::Batch& data) override { return {{"logits", forward(data.at("image"))}}; }

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr}, fc3_{nullptr};
};

LOCKSTEP_REGISTER(lockstep::model_registry(), "LeNet", [](const lockstep::Config& config) {
  return std::make_shared<LeNet>(config.get<int64_t>("num_classes", 10));
});

}  // namespace

int main(int argc, char** argv) {
  try {
    auto command = lockstep::parse_command_line(argc, argv);
    if (!command) return 2;
    lockstep::Runner runner(command->config, command->options);
    runner.train();
    auto metrics = runner.test();
    if (runner.strategy().collectives()->is_main_process()) std::cout << "LeNet test accuracy: " << metrics["accuracy/top1"] << "\n";
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "custom_model: error: " << error.what() << "\n";
    return 1;
  }
}
