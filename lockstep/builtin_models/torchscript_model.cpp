#include "lockstep/builtin_models/torchscript_model.h"

#include "lockstep/model/named_loss.h"

#include <filesystem>
#include <optional>
#include <sstream>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"
#include "lockstep/optim/paramwise.h"

namespace lockstep {
namespace {

// A node of the scripted module's tree on the C++ side: it holds the same
// parameter and buffer tensors, under the same names, its type's short name,
// and what paramwise_cfg's rules ask of a convolution.
class ScriptedPart : public torch::nn::Module {
 public:
  ScriptedPart(const std::string& type, std::optional<int64_t> in_channels, std::optional<int64_t> groups)
      : torch::nn::Module(type), in_channels_(in_channels), groups_(groups) {}
  bool is_depthwise() const { return in_channels_ && groups_ && *in_channels_ == *groups_; }

 private:
  std::optional<int64_t> in_channels_, groups_;
};

// "__torch__.torch.nn.modules.conv.Conv2d" -> "Conv2d".
std::string short_type_name(const torch::jit::Module& module) {
  const std::string full = module.type()->name() ? module.type()->name()->qualifiedName() : "ScriptedModule";
  const size_t dot = full.rfind('.');
  return dot == std::string::npos ? full : full.substr(dot + 1);
}

// An int the scripted module holds as an attribute or, as torch.nn.Conv2d's
// in_channels and groups (its __constants__), a constant of its type.
std::optional<int64_t> int_member(const torch::jit::Module& module, const std::string& name) {
  c10::IValue value;
  if (module.hasattr(name)) {
    value = module.attr(name);
  } else if (module.type()->hasConstant(name)) {
    value = module.type()->getConstant(name);
  }
  return value.isInt() ? std::optional<int64_t>(value.toInt()) : std::nullopt;
}

void mirror(const torch::jit::Module& scripted, torch::nn::Module& into) {
  for (const auto& item : scripted.named_parameters(/*recurse=*/false)) {
    into.register_parameter(item.name, item.value, item.value.requires_grad());
  }
  for (const auto& item : scripted.named_buffers(/*recurse=*/false)) into.register_buffer(item.name, item.value);
  for (const auto& child : scripted.named_children()) {
    auto part = std::make_shared<ScriptedPart>(short_type_name(child.value), int_member(child.value, "in_channels"),
                                               int_member(child.value, "groups"));
    mirror(child.value, *part);
    into.register_module(child.name, part);
  }
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// paramwise_cfg's rules see the scripted module's layers by their Python
// class names, as mmengine's isinstance checks see them in Python (a
// scripted mmcv DeformConv2d keeps its name).
const bool kScriptedTraitsRegistered = [] {
  add_module_traits_reader([](const torch::nn::Module& module, ModuleTraits& traits) {
    const auto* part = dynamic_cast<const ScriptedPart*>(&module);
    if (part == nullptr) return;
    const std::string& type = part->name();
    for (const char* norm : {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "InstanceNorm1d",
                             "InstanceNorm2d", "InstanceNorm3d", "GroupNorm", "LayerNorm"}) {
      if (type == norm) traits.norm = true;
    }
    if (type == "Conv2d") {
      traits.conv2d = true;
      traits.depthwise_conv = part->is_depthwise();
    }
    if (type == "DeformConv2d" || type == "ModulatedDeformConv2d") traits.deformable_conv = true;
  });
  return true;
}();

}  // namespace

TorchScriptModel::TorchScriptModel(const TorchScriptModelOptions& options) : options_(options) {
  LOCKSTEP_CHECK(!options_.path().empty(), "TorchScriptModel: path is required (a torch.jit.save file)");
  LOCKSTEP_CHECK(std::filesystem::is_regular_file(options_.path()), options_.path(),
                 ": no such file (TorchScriptModel's path: a torch.jit.save file)");
  try {
    module_ = torch::jit::load(options_.path(), torch::kCPU);
  } catch (const std::exception& error) {
    LOCKSTEP_FAIL(options_.path(), ": not a TorchScript module (torch.jit.script(model) then torch.jit.save): ",
                  first_line(error.what()),
                  "; a torch.save state dict is a load_from file, for a model defined in C++ or scripted");
  }
  LOCKSTEP_CHECK(module_.find_method("forward").has_value(), options_.path(), ": the scripted module has no forward");
  if (!options_.loss_method().empty()) {
    if (!module_.find_method(options_.loss_method())) {
      std::string methods;
      for (const auto& method : module_.get_methods()) methods += (methods.empty() ? "" : ", ") + method.name();
      LOCKSTEP_FAIL(options_.path(), ": loss_method '", options_.loss_method(), "' is not a method of the scripted "
                    "module (it has: ", methods, "); mark it @torch.jit.export in Python");
    }
  } else {
    const std::string& loss = options_.loss();
    LOCKSTEP_CHECK(is_named_loss(loss),
                   "TorchScriptModel: loss must be cross_entropy, mse, l1 or bce_with_logits, got '", loss, "'");
  }
  mirror(module_, *this);
  train(true);
}

torch::Tensor TorchScriptModel::forward(const torch::Tensor& input) {
  c10::IValue output = module_.forward({input});
  LOCKSTEP_CHECK(output.isTensor(), options_.path(), ": forward returned ", output.tagKind(),
                 "; TorchScriptModel needs forward(input) -> Tensor (the logits)");
  return output.toTensor();
}

LossDict TorchScriptModel::loss(const Batch& data) {
  const torch::Tensor& input = data.at(options_.input_key());
  const torch::Tensor& target = data.at(options_.target_key());
  LossDict losses;
  if (!options_.loss_method().empty()) {
    c10::IValue result = module_.get_method(options_.loss_method())({input, target});
    LOCKSTEP_CHECK(result.isGenericDict(), options_.path(), ": ", options_.loss_method(), " returned ",
                   result.tagKind(), "; it must return Dict[str, Tensor]");
    for (const auto& entry : result.toGenericDict()) {
      LOCKSTEP_CHECK(entry.key().isString() && entry.value().isTensor(), options_.path(), ": ",
                     options_.loss_method(), " must return Dict[str, Tensor]");
      losses.insert(entry.key().toStringRef(), entry.value().toTensor());
    }
    return losses;
  }
  return named_loss(options_.loss(), forward(input), target, options_.path());
}

Batch TorchScriptModel::predict(const Batch& data) { return Batch{{"logits", forward(data.at(options_.input_key()))}}; }

void TorchScriptModel::train(bool on) {
  Model::train(on);
  module_.train(on);
}

void TorchScriptModel::save_torchscript(const std::string& path) {
  std::ostringstream bytes;
  module_.save(bytes);
  AtomicFileWriter out(path);
  out.write(bytes.str());
  out.commit();
}

LOCKSTEP_REGISTER(model_registry(), "TorchScriptModel", [](const Config& config) {
  TorchScriptModelOptions options;
  options.path(config.get<std::string>("path", ""))
      .input_key(config.get<std::string>("input_key", "image"))
      .target_key(config.get<std::string>("target_key", "label"))
      .loss(config.get<std::string>("loss", "cross_entropy"))
      .loss_method(config.get<std::string>("loss_method", ""));
  LOCKSTEP_CHECK(!options.path().empty(), config.where(), ": TorchScriptModel needs path (a torch.jit.save file)");
  return std::make_shared<TorchScriptModel>(options);
});

}  // namespace lockstep
