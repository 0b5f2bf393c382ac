// TorchScriptModel: train a model defined in Python and exported with
// torch.jit.script / torch.jit.save, from C++, like any lockstep model.
//
//   model:
//     type: TorchScriptModel
//     path: exported/cnn.pt        # torch.jit.save's output
//     input_key: image             # the batch entry forward() takes (default image)
//     target_key: label            # default label
//     loss: cross_entropy          # cross_entropy | mse | l1 | bce_with_logits, on forward's output
//     # or: loss_method: compute_loss   a scripted method (input, target) -> Dict[str, Tensor]
//     data_preprocessor: {type: ImgDataPreprocessor, mean: [72.94], std: [90.02]}
//
// forward(input) returns the logits, so predictions ("logits") work with the
// evaluators. The scripted module's parameters and buffers are this Module's
// own, under the names Python's state_dict() gives them (the same tensors,
// not copies): optimizers, DDP (every option, separate DDP too), checkpoints,
// bitwise resume, load_from and autocast see them as for a C++ model, and
// train()/eval() reach the scripted module. Two limits, both refused with
// the reason: FSDP shards it as one unit (no auto_wrap_policy: its
// submodules run inside TorchScript), and sync_bn cannot convert BatchNorm
// layers that live inside TorchScript.
//
//   auto model = std::make_shared<lockstep::TorchScriptModel>(
//       lockstep::TorchScriptModelOptions().path("cnn.pt"));
//   model->save_torchscript("trained.pt");   // torch.jit.load reads it, with the current weights
#pragma once

#include <torch/script.h>

#include <string>

#include "lockstep/model/model.h"

namespace lockstep {

struct TorchScriptModelOptions {
  TORCH_ARG(std::string, path) = "";
  TORCH_ARG(std::string, input_key) = "image";
  TORCH_ARG(std::string, target_key) = "label";
  // cross_entropy | mse | l1 | bce_with_logits; ignored with loss_method.
  TORCH_ARG(std::string, loss) = "cross_entropy";
  TORCH_ARG(std::string, loss_method) = "";
};

class TorchScriptModel : public Model {
 public:
  explicit TorchScriptModel(const TorchScriptModelOptions& options);

  LossDict loss(const Batch& data) override;
  Batch predict(const Batch& data) override;
  torch::Tensor forward(const torch::Tensor& input);
  void train(bool on = true) override;
  TensorKeys tensor_keys() const override { return {options_.input_key(), options_.target_key(), "logits"}; }
  bool submodules_run_in_cpp() const override { return false; }

  torch::jit::Module& scripted() { return module_; }
  // torch.jit.save of the module with its current weights, atomically.
  void save_torchscript(const std::string& path);

 private:
  TorchScriptModelOptions options_;
  torch::jit::Module module_;
};

}  // namespace lockstep
