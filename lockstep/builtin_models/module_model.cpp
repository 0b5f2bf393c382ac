#include "lockstep/builtin_models/module_model.h"

#include "lockstep/core/error.h"
#include "lockstep/model/named_loss.h"

namespace lockstep {

ModuleModel::ModuleModel(torch::nn::AnyModule forward, std::shared_ptr<torch::nn::Module> module,
                         ModuleModelOptions options)
    : forward_(std::move(forward)), options_(std::move(options)) {
  LOCKSTEP_CHECK(module != nullptr, "ModuleModel: the module is null");
  LOCKSTEP_CHECK(is_named_loss(options_.loss()), "ModuleModel: loss must be cross_entropy, mse, l1 or "
                 "bce_with_logits, got '", options_.loss(), "'");
  register_module("net", std::move(module));
}

torch::Tensor ModuleModel::forward(const torch::Tensor& input) { return forward_.forward(input); }

LossDict ModuleModel::loss(const Batch& data) {
  return named_loss(options_.loss(), forward(data.at(options_.input_key())), data.at(options_.target_key()),
                    "ModuleModel");
}

Batch ModuleModel::predict(const Batch& data) { return Batch{{"output", forward(data.at(options_.input_key()))}}; }

}  // namespace lockstep
