#include "lockstep/checkpoint/safetensors_tools.h"

#include <filesystem>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/checkpoint/internal/ema_state_keys.h"
#include "lockstep/checkpoint/pretrained.h"
#include "lockstep/checkpoint/pt_file.h"
#include "lockstep/checkpoint/sharded_checkpoint.h"
#include "lockstep/core/error.h"
#include "lockstep/core/state.h"

namespace lockstep {
bool is_lockstep_checkpoint(const nlohmann::json& header) {
  auto metadata = header.find("__metadata__");
  if (metadata == header.end() || !metadata->is_object()) return false;
  auto format = metadata->find("format");
  return format != metadata->end() && format->is_string() && format->get<std::string>() == "lockstep";
}

namespace {

// The EMAHook's average in a checkpoint's trainer state, by the model's
// names (checkpoint/internal/ema_state_keys.h): gathered (FSDP) or parameter and
// buffer (one process, DDP).
std::map<std::string, torch::Tensor> ema_weights(const CheckpointContents& contents, const std::string& path) {
  const State ema = contents.trainer ? contents.trainer->get("hooks").get("EMAHook") : State();
  std::map<std::string, torch::Tensor> weights;
  for (const auto& [name, tensor] : ema.tensors) {
    for (const char* prefix : {ema_keys::kGathered, ema_keys::kParameter, ema_keys::kBuffer}) {
      const std::string p = prefix;
      if (name.rfind(p, 0) == 0) weights[name.substr(p.size())] = tensor;
    }
  }
  LOCKSTEP_CHECK(!weights.empty(), path, ": the checkpoint holds no EMAHook state (train with custom_hooks: "
                 "[{type: EMAHook}] to have an averaged model to export)");
  return weights;
}

}  // namespace

size_t export_weights(const std::string& checkpoint, const std::string& out, const ExportOptions& options) {
  std::map<std::string, std::string> metadata{
      {"format", "pt"}, {"lockstep.source", std::filesystem::path(checkpoint).filename().string()}};
  std::map<std::string, torch::Tensor> weights;
  if (is_lockstep_checkpoint_file(checkpoint)) {
    CheckpointContents contents = read_checkpoint(checkpoint);
    weights = options.ema() ? ema_weights(contents, checkpoint) : whole_model_weights(contents, checkpoint);
    if (contents.meta) {
      metadata["lockstep.iteration"] = std::to_string(contents.meta->iteration);
      if (!contents.meta->config.empty()) metadata["lockstep.config"] = contents.meta->config;
    }
  } else {
    LOCKSTEP_CHECK(!options.ema(), checkpoint, ": an EMA export needs a lockstep checkpoint of a run with EMAHook");
    weights = read_model_weights(checkpoint);
  }
  if (options.dtype()) {
    LOCKSTEP_CHECK(c10::isFloatingType(*options.dtype()), "export of ", checkpoint, ": --dtype must be a floating-point type, got ",
                   c10::toString(*options.dtype()));
    for (auto& [name, tensor] : weights) {
      if (c10::isFloatingType(tensor.scalar_type())) tensor = tensor.to(*options.dtype());
    }
  }
  if (options.format() == ExportFormat::kPt) {
    write_pt_state_dict(weights, out);
  } else {
    write_safetensors_file(out, weights, metadata);
  }
  return weights.size();
}

}  // namespace lockstep
