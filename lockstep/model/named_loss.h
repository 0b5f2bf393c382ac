// The losses a model names in its config instead of writing them: what
// TorchScriptModel and ModuleModel compute from their output and the target.
//
//   lockstep::LossDict losses = lockstep::named_loss("mse", output, target, "model.loss");
//   // {"loss_mse": ...}; "cross_entropy" and "bce_with_logits" give "loss_cls", "l1" "loss_l1"
#pragma once

#include <string>

#include "lockstep/model/model.h"

namespace lockstep {

// The names named_loss knows.
bool is_named_loss(const std::string& name);
// `where` (a config location or a model's name) starts the error for an unknown name.
LossDict named_loss(const std::string& name, const torch::Tensor& output, const torch::Tensor& target,
                    const std::string& where);

}  // namespace lockstep
