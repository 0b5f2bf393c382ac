// ModuleModel: a plain torch::nn::Module trained as a lockstep Model, for a
// program that builds its network in C++ and hands it to a StepTrainer (or a
// Runner) without writing a Model class: forward(input) -> output, and a loss
// by name between the output and the target.
//
//   torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)), torch::nn::Tanh(),
//                             torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 1, 3).padding(1)));
//   auto model = std::make_shared<lockstep::ModuleModel>(net, lockstep::ModuleModelOptions().loss("mse"));
//   lockstep::StepTrainer trainer(model, lockstep::parse_config("optim_wrapper: {optimizer: {type: Adam}}"));
//   trainer.train_step({{"input", x}, {"target", y}});
//
// The module's parameters and buffers are the model's, under "net.<its own
// names>"; predictions are {"output": forward(input)}.
#pragma once

#include <string>

#include "lockstep/model/model.h"

namespace lockstep {

struct ModuleModelOptions {
  TORCH_ARG(std::string, input_key) = "input";
  TORCH_ARG(std::string, target_key) = "target";
  // cross_entropy | mse | l1 | bce_with_logits (model/named_loss.h).
  TORCH_ARG(std::string, loss) = "mse";
};

class ModuleModel : public Model {
 public:
  // Any module whose forward takes one tensor and returns one.
  template <typename ModuleHolder>
  ModuleModel(ModuleHolder module, ModuleModelOptions options = ModuleModelOptions())
      : ModuleModel(torch::nn::AnyModule(module), module.ptr(), std::move(options)) {}

  LossDict loss(const Batch& data) override;
  Batch predict(const Batch& data) override;
  torch::Tensor forward(const torch::Tensor& input);
  TensorKeys tensor_keys() const override { return {options_.input_key(), options_.target_key(), "output"}; }

 private:
  ModuleModel(torch::nn::AnyModule forward, std::shared_ptr<torch::nn::Module> module, ModuleModelOptions options);

  torch::nn::AnyModule forward_;
  ModuleModelOptions options_;
};

}  // namespace lockstep
