// Pretrained weights: start a model from a safetensors file (the Hugging Face
// ecosystem's format, or `lockstep ckpt export`'s output), a sharded one's
// index, another lockstep checkpoint, or a PyTorch .pt/.pth state dict,
// renaming keys that come from another codebase, and report what did not fit.
//
// In a config (mmengine's load_from, with its key revision spelled out):
//
//   load_from: pretrained/mlp.safetensors          # a path alone, or:
//   load_from:
//     path: pretrained/mlp.safetensors
//     strip_prefix: "model."                       # "model.fc.weight" -> "fc.weight"
//     rename:                                      # ECMAScript regexes, applied in order
//       - {pattern: "^encoder\\.(\\d+)\\.", replacement: "layers.$1."}
//       - ["^head\\.", "classifier."]              # the [pattern, replacement] form
//     add_prefix: "backbone."
//     strict: false                                # true: any missing/unexpected/mis-shaped key is an error
//
// In code:
//
//   auto options = lockstep::PretrainedOptions().path("mlp.safetensors").strip_prefix("model.");
//   lockstep::PretrainedSource source = lockstep::read_pretrained(options);   // here: reading and remapping
//   lockstep::PretrainedReport report = lockstep::load_pretrained(strategy, options);  // strategy/load_pretrained.h
//   for (const auto& key : report.load.missing) ...   // model keys the file did not provide
//
// A run that resumes ignores load_from (the resumed checkpoint has newer weights).
#pragma once

#include <map>
#include <regex>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

#include "lockstep/config/config.h"
#include "lockstep/core/load_report.h"

namespace lockstep {

struct RenameRule {
  std::string pattern;      // ECMAScript regular expression, searched in the key
  std::string replacement;  // std::regex_replace format: $1, $2 ... for groups
};

struct PretrainedOptions {
  // A .safetensors file, a *.safetensors.index.json of a sharded one, a
  // lockstep checkpoint, or a PyTorch .pt/.pth file (torch.save of a state dict,
  // or of a dict holding one under state_dict/model; see pt_file.h).
  TORCH_ARG(std::string, path) = "";
  // Removed from keys that start with it; other keys pass unchanged.
  TORCH_ARG(std::string, strip_prefix) = "";
  // Applied after strip_prefix, in order, each to the previous one's result.
  TORCH_ARG(std::vector<RenameRule>, rename) = {};
  // Put in front of every key last.
  TORCH_ARG(std::string, add_prefix) = "";
  // Missing, unexpected or mis-shaped keys are an error instead of a warning.
  TORCH_ARG(bool, strict) = false;
};

// The file-key -> model-key mapping of PretrainedOptions: strip_prefix, then
// the rename rules in order, then add_prefix.
class KeyRemap {
 public:
  // An invalid regex is an error naming the rule and its pattern.
  explicit KeyRemap(const PretrainedOptions& options);
  bool identity() const;
  std::string apply(const std::string& key) const;

 private:
  std::string strip_prefix_;
  std::vector<std::pair<std::regex, std::string>> rules_;
  std::string add_prefix_;
};

// Model weights as stored in `path` (no remapping): every tensor of a
// safetensors file or of the shards an index names, of a torch.save file, of
// a PyTorch DCP checkpoint directory (dcp_checkpoint.h, at any saved world
// size), or the model part of a lockstep checkpoint (checksums verified).
// Errors name the file and the key.
std::map<std::string, torch::Tensor> read_model_weights(const std::string& path);

// Whether `path` is a lockstep checkpoint (not one of the other formats above).
bool is_lockstep_checkpoint_file(const std::string& path);

struct PretrainedWeights {
  std::map<std::string, torch::Tensor> tensors;   // by model key
  std::map<std::string, std::string> file_keys;   // model key -> its key in the file, where they differ
};
// Applies `remap` to every key; two file keys landing on one model key is an
// error naming both (and `path`).
PretrainedWeights remap_weights(std::map<std::string, torch::Tensor> weights, const KeyRemap& remap,
                                const std::string& path);

// What load_from's file holds: weights by model key, or -- a sharded FSDP
// checkpoint -- a manifest whose weights live in per-rank files beside it,
// which only FSDP on the same ranks can load (Strategy::load_sharded_weights).
struct PretrainedSource {
  PretrainedWeights weights;
  bool sharded_checkpoint = false;
};
// Reads options.path() and remaps its keys. A remapping of a sharded
// checkpoint is an error (its shards load only under their own names).
PretrainedSource read_pretrained(const PretrainedOptions& options);

struct PretrainedReport {
  LoadReport load;                                // by model key
  std::map<std::string, std::string> file_keys;   // model key -> file key, for renamed keys
  size_t loaded = 0;                              // tensors copied into the model
  // LoadReport::describe plus the file key of every renamed key it lists.
  std::string describe(const std::string& source) const;
  // "Renamed by load_from (model key <- file key): ..." for the keys the load report names; "" if none.
  std::string renamed_note() const;
};

// `load_from:` of a config: null, a path, or a map {path, strip_prefix,
// rename, add_prefix, strict}. A non-empty `path_override` (the CLI's
// --load-from) replaces the path and keeps the remapping. Errors name the
// config key.
PretrainedOptions parse_load_from(const Config& node, const std::string& path_override = "");

}  // namespace lockstep
