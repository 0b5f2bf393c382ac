// Model: the contract between a network and the trainer.
//
// A model is a torch::nn::Module that knows how to compute its losses and its
// predictions from a Batch. The default train_step runs the data
// preprocessor, `loss()` under the optim wrapper's context, sums the losses
// (parse_losses) and calls update_params; override it for anything else
// (several optimizers, several backward passes).
//
//   class Net : public lockstep::Model {
//    public:
//     Net() { fc = register_module("fc", torch::nn::Linear(784, 10)); }
//     lockstep::LossDict loss(const lockstep::Batch& data) override {
//       auto logits = fc(data.at("image").flatten(1));
//       lockstep::LossDict losses;
//       losses.insert("loss_cls", torch::cross_entropy_loss(logits, data.at("label")));
//       return losses;
//     }
//     lockstep::Batch predict(const lockstep::Batch& data) override {
//       return {{"logits", fc(data.at("image").flatten(1))}};
//     }
//     torch::nn::Linear fc{nullptr};
//   };
//   LOCKSTEP_REGISTER(lockstep::model_registry(), "Net",
//                     [](const lockstep::Config&) { return std::make_shared<Net>(); });
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "lockstep/config/registry.h"
#include "lockstep/model/batch.h"
#include "lockstep/model/data_preprocessor.h"
#include "lockstep/model/log_values_on_device.h"
#include "lockstep/optim/optim_wrapper.h"

namespace lockstep {

// Named loss terms (and any other scalar tensors to log), in insertion order.
using LossDict = torch::OrderedDict<std::string, torch::Tensor>;

struct ParsedLosses {
  torch::Tensor loss;  // the sum of every entry whose name contains "loss"
  LogVars log_vars;    // every entry's mean, plus "loss"
};

// mmengine's parse_losses: entries whose key contains "loss" are summed into
// the total; every entry is logged by its mean value. With `on_device`, the
// logged values go there as tensors instead of being read into log_vars
// (model/log_values_on_device.h); the default train_step passes the one the
// trainer opened.
ParsedLosses parse_losses(const LossDict& losses, LogValuesOnDevice* on_device = nullptr);

class Model : public torch::nn::Module {
 public:
  Model();
  ~Model() override;

  // Forward in "loss" mode: named losses for a preprocessed batch.
  virtual LossDict loss(const Batch& data) = 0;
  // Forward in "predict" mode: named outputs for a preprocessed batch.
  virtual Batch predict(const Batch& data) = 0;

  // One training step with one optimizer.
  virtual LogVars train_step(const Batch& batch, OptimWrapper& optim_wrapper);
  // One training step with several named optimizers (multi-network models).
  // The default explains that the model must override it.
  virtual LogVars train_step(const Batch& batch, OptimWrapperDict& optim_wrappers);
  // The trainer's entry: the train_step overload for `optim_wrapper`'s kind
  // (one wrapper or a dict), inside the step `step` describes.
  LogVars run_train_step(const Batch& batch, OptimWrapperBase& optim_wrapper, const StepContext& step = StepContext());
  // Predictions for evaluation (no gradients, data preprocessed in eval mode).
  virtual Batch val_step(const Batch& batch);
  virtual Batch test_step(const Batch& batch);

  // The batch entries a caller that holds plain tensors fills and reads (the
  // C API's input and target, and the prediction it returns): lockstep's
  // classifiers' "image", "label" and "logits" unless a model says otherwise.
  struct TensorKeys {
    std::string input = "image";
    std::string target = "label";
    std::string output = "logits";
  };
  virtual TensorKeys tensor_keys() const { return TensorKeys(); }

  // Whether the model's submodules run as C++ modules, so that a strategy may
  // replace them (SyncBatchNorm conversion) or gather their parameters one at
  // a time (FSDP's auto-wrapped units). false for a model whose forward runs
  // elsewhere: TorchScriptModel's runs inside TorchScript.
  virtual bool submodules_run_in_cpp() const { return true; }

  DataPreprocessor& data_preprocessor() const { return *data_preprocessor_; }
  void set_data_preprocessor(std::shared_ptr<DataPreprocessor> preprocessor);
  // Moves the module and tells the preprocessor where data must go.
  void move_to(const torch::Device& device) { to(device); }
  // torch::nn::Module::to, and the data preprocessor follows: a batch goes to
  // the model's device however the model was moved, model->to(cuda) in a
  // user's C++ included.
  using torch::nn::Module::to;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  torch::Device device() const { return data_preprocessor_->device(); }

  // The dtype the model's own outputs are cast to, the counterpart of its
  // preprocessor's input_dtype: the floating-point losses loss() returns (in
  // the default train_step) and the predictions predict() returns (in
  // val_step). FSDPStrategy sets it to FullyShard's mp_policy.output_dtype,
  // which fully_shard applies to the root's forward output: here the root's
  // forward is loss() or predict(), as mmengine's forward(mode=...) is.
  // Unset, they keep their own. A train_step of one's own applies it itself.
  void set_output_dtype(c10::optional<torch::Dtype> dtype) { output_dtype_ = dtype; }
  c10::optional<torch::Dtype> output_dtype() const { return output_dtype_; }

 private:
  std::shared_ptr<DataPreprocessor> data_preprocessor_;
  c10::optional<torch::Dtype> output_dtype_;
};

Registry<Model>& model_registry();

// Builds `model:` from config, including its `data_preprocessor` entry, its
// `memory_format` (model/memory_format.h: the parameters and the inputs), its
// `frozen_parameters` (freeze_parameters below) and its `frozen_dtype`
// (store_frozen_parameters_in below).
std::shared_ptr<Model> build_model(const Config& config);

// `frozen_parameters: [backbone, head.0.weight]`: every parameter with one of
// these names, or inside a module of one, stops requiring a gradient (Python's
// requires_grad_(False)): no optimizer steps it, DDP does not reduce it, and
// under FullyShard it is sharded with its unit (LoRA-style fine-tuning: the
// base frozen, adapters trained). A name that matches no parameter is an
// error naming `where` and the model's parameters.
void freeze_parameters(torch::nn::Module& model, const std::vector<std::string>& names, const std::string& where);

// `frozen_dtype: bf16`: every floating-point parameter that requires no
// gradient (frozen by frozen_parameters or by the model itself, as LoRA
// models freeze their base) is stored in `dtype` from now on, as peft keeps a
// bf16 base beside fp32 adapters: half the memory, and loads into it are
// cast. The model's forward must accept that mix (compute in one dtype with
// FullyShard's mp_policy.param_dtype, or cast as the GPT example's LoRA
// does). Under FullyShard a unit may then hold two dtypes (Note [A unit of
// several dtypes]).
void store_frozen_parameters_in(torch::nn::Module& model, torch::Dtype dtype);

}  // namespace lockstep
