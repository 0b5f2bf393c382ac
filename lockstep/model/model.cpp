#include "lockstep/model/model.h"

#include <ATen/record_function.h>

#include "lockstep/core/dtype_name.h"
#include "lockstep/core/error.h"
#include "lockstep/model/memory_format.h"

namespace lockstep {

ParsedLosses parse_losses(const LossDict& losses, LogValuesOnDevice* on_device) {
  ParsedLosses parsed;
  std::vector<torch::Tensor> terms;
  for (const auto& item : losses) {
    const torch::Tensor& value = item.value();
    LOCKSTEP_CHECK(value.defined(), "loss entry '", item.key(), "' is an undefined tensor");
    torch::Tensor mean = value.numel() == 1 ? value.reshape({}) : value.mean();
    if (item.key().find("loss") != std::string::npos) terms.push_back(mean);
    if (on_device != nullptr) {
      on_device->put(item.key(), mean);
    } else {
      parsed.log_vars[item.key()] = mean.detach().item<double>();
    }
  }
  LOCKSTEP_CHECK(!terms.empty(), "the model's loss() returned no entry whose name contains 'loss' (got ",
                 losses.size(), " entries); parse_losses sums exactly those");
  parsed.loss = terms.size() == 1 ? terms.front() : torch::stack(terms).sum();
  if (on_device != nullptr) {
    on_device->put("loss", parsed.loss);
  } else {
    parsed.log_vars["loss"] = parsed.loss.detach().item<double>();
  }
  return parsed;
}

Model::Model() : data_preprocessor_(std::make_shared<DataPreprocessor>()) {}
Model::~Model() = default;

LogVars Model::train_step(const Batch& batch, OptimWrapper& optim_wrapper) {
  ParsedLosses parsed;
  {
    RECORD_USER_SCOPE("lockstep::forward");
    auto context = optim_wrapper.optim_context();
    Batch data = data_preprocessor()(batch, /*training=*/true);
    // The trainer reads the values later when it keeps them on the device
    // (Note [Logged values read after the step]).
    LossDict losses = loss(data);
    for (auto& item : losses) item.value() = cast_floating(item.value(), output_dtype_);
    parsed = parse_losses(losses, LogValuesOnDevice::current());
  }
  optim_wrapper.update_params(parsed.loss);
  return parsed.log_vars;
}

LogVars Model::train_step(const Batch& /*batch*/, OptimWrapperDict& optim_wrappers) {
  std::string names;
  for (const auto& name : optim_wrappers.names()) names += (names.empty() ? "" : ", ") + name;
  LOCKSTEP_FAIL("this model is trained with several optimizers (", names,
                ") and must override train_step(const Batch&, OptimWrapperDict&) to say in which order "
                "its networks are updated");
}

LogVars Model::run_train_step(const Batch& batch, OptimWrapperBase& optim_wrapper, const StepContext& step) {
  auto scope = optim_wrapper.begin_step(step);
  try {
    if (OptimWrapperDict* dict = optim_wrapper.as_dict()) return train_step(batch, *dict);
    return train_step(batch, *optim_wrapper.wrappers().front().second);
  } catch (...) {
    // The gradient sync may replace the error with the one every rank agrees on.
    optim_wrapper.abandon_step(std::current_exception());
    throw;
  }
}

Batch Model::val_step(const Batch& batch) {
  torch::NoGradGuard no_grad;
  return predict(data_preprocessor()(batch, /*training=*/false)).cast_floating(output_dtype_);
}

Batch Model::test_step(const Batch& batch) { return val_step(batch); }

void Model::set_data_preprocessor(std::shared_ptr<DataPreprocessor> preprocessor) {
  LOCKSTEP_CHECK(preprocessor != nullptr, "set_data_preprocessor(nullptr)");
  preprocessor->set_device(data_preprocessor_->device());
  preprocessor->set_input_memory_format(data_preprocessor_->input_memory_format());
  data_preprocessor_ = std::move(preprocessor);
}

void Model::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  data_preprocessor_->set_device(device);
}

void Model::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  data_preprocessor_->set_device(device);
}

Registry<Model>& model_registry() {
  static Registry<Model> registry("model");
  return registry;
}

void freeze_parameters(torch::nn::Module& model, const std::vector<std::string>& names, const std::string& where) {
  const auto params = model.named_parameters(/*recurse=*/true);
  for (const auto& name : names) {
    int matched = 0;
    for (const auto& item : params) {
      const std::string& key = item.key();
      if (key != name && key.rfind(name + ".", 0) != 0) continue;
      item.value().requires_grad_(false);
      ++matched;
    }
    if (matched > 0) continue;
    std::string known;
    for (const auto& item : params) known += (known.empty() ? "" : ", ") + item.key();
    LOCKSTEP_FAIL(where, ": frozen_parameters names '", name, "', which is no parameter of the model nor a module "
                  "holding one (its parameters: ", known, ")");
  }
}

void store_frozen_parameters_in(torch::nn::Module& model, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  for (auto& param : model.parameters(/*recurse=*/true)) {
    if (param.requires_grad() || !param.is_floating_point() || param.scalar_type() == dtype) continue;
    param.set_data(param.to(dtype));
  }
}

std::shared_ptr<Model> build_model(const Config& config) {
  LOCKSTEP_CHECK(config.is_map(), config.where(), ": model must be a map with a 'type' key");
  // The preprocessor is configured inside the model section but built here,
  // so every model gets it without reading it itself.
  Config preprocessor_config = config.child("data_preprocessor");
  std::shared_ptr<DataPreprocessor> preprocessor;
  if (!preprocessor_config.is_null()) {
    preprocessor = data_preprocessor_registry().build(preprocessor_config);
  }
  // Likewise PyTorch's model.to(memory_format=...), which the inputs follow.
  c10::optional<c10::MemoryFormat> memory_format;
  if (config.has("memory_format")) {
    memory_format = parse_memory_format(config.get<std::string>("memory_format"), config.where("memory_format"));
  }
  std::vector<std::string> frozen;
  if (config.has("frozen_parameters")) frozen = config.get<std::vector<std::string>>("frozen_parameters");
  c10::optional<torch::Dtype> frozen_dtype;
  if (config.has("frozen_dtype")) {
    frozen_dtype = parse_dtype(config.get<std::string>("frozen_dtype"), config.where("frozen_dtype"));
  }
  auto model = model_registry().build(config);
  freeze_parameters(*model, frozen, config.where("frozen_parameters"));
  if (frozen_dtype) store_frozen_parameters_in(*model, *frozen_dtype);
  if (preprocessor) model->set_data_preprocessor(preprocessor);
  if (memory_format) {
    to_memory_format(*model, *memory_format);
    model->data_preprocessor().set_input_memory_format(*memory_format);
  }
  return model;
}

}  // namespace lockstep
