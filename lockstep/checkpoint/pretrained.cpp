#include "lockstep/checkpoint/pretrained.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/safetensors_tools.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/strategy/fsdp_strategy.h"

namespace lockstep {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_index_file(const std::string& path) { return ends_with(path, ".index.json"); }

bool is_sharded_fsdp(const State& state) {
  return state.values.is_object() && state.values.contains("fsdp") && state.values["fsdp"].is_object() &&
         state.values["fsdp"].value("state_dict_type", "") == "sharded";
}

// Hugging Face's sharded layout: {"metadata": {...}, "weight_map": {"key": "model-00001-of-00002.safetensors"}},
// shard names relative to the index.
std::map<std::string, torch::Tensor> read_sharded(const std::string& index_path) {
  std::ifstream in(index_path);
  LOCKSTEP_CHECK(in.good(), "cannot open ", index_path);
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    LOCKSTEP_FAIL(index_path, ": not valid JSON (", error.what(), ")");
  }
  LOCKSTEP_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object() &&
                     !index["weight_map"].empty(),
                 index_path, ": a safetensors index needs a non-empty \"weight_map\" object of tensor name -> file");
  std::map<std::string, std::vector<std::string>> keys_by_shard;
  for (const auto& item : index["weight_map"].items()) {
    LOCKSTEP_CHECK(item.value().is_string(), index_path, ": weight_map entry '", item.key(), "' is not a file name");
    keys_by_shard[item.value().get<std::string>()].push_back(item.key());
  }
  std::map<std::string, torch::Tensor> weights;
  const fs::path dir = fs::path(index_path).parent_path();
  for (const auto& [shard, keys] : keys_by_shard) {
    const std::string shard_path = (dir / shard).string();
    SafetensorsContent content = read_safetensors_file(shard_path);
    for (const auto& key : keys) {
      auto found = content.tensors.find(key);
      LOCKSTEP_CHECK(found != content.tensors.end(), index_path, ": weight_map puts tensor '", key, "' in ", shard_path,
                     ", which has no such tensor");
      weights[key] = found->second;
    }
  }
  return weights;
}

PretrainedWeights remap_weights(std::map<std::string, torch::Tensor> weights, const KeyRemap& remap,
                                const std::string& path) {
  PretrainedWeights result;
  if (remap.identity()) {
    result.tensors = std::move(weights);
    return result;
  }
  std::map<std::string, std::string> source_of;
  for (auto& [file_key, tensor] : weights) {
    std::string model_key = remap.apply(file_key);
    LOCKSTEP_CHECK(!model_key.empty(), path, ": load_from's remapping turns tensor '", file_key, "' into an empty name");
    auto [previous, inserted] = source_of.emplace(model_key, file_key);
    LOCKSTEP_CHECK(inserted, path, ": load_from's remapping maps both '", previous->second, "' and '", file_key,
                   "' to '", model_key, "'");
    if (model_key != file_key) result.file_keys[model_key] = file_key;
    result.tensors[model_key] = std::move(tensor);
  }
  return result;
}

std::string renamed_note(const std::vector<std::string>& model_keys, const std::map<std::string, std::string>& file_keys) {
  std::string note;
  for (const auto& key : model_keys) {
    auto found = file_keys.find(key);
    if (found == file_keys.end()) continue;
    note += (note.empty() ? "" : ", ") + key + " <- " + found->second;
  }
  return note.empty() ? note : "Renamed by load_from (model key <- file key): " + note;
}

// The model keys a report names: unexpected keys, and mis-shaped entries ("key: ...").
std::vector<std::string> reported_keys(const LoadReport& report) {
  std::vector<std::string> keys = report.unexpected;
  for (const auto& entry : report.mismatched) keys.push_back(entry.substr(0, entry.find(": ")));
  return keys;
}

}  // namespace

KeyRemap::KeyRemap(const PretrainedOptions& options)
    : strip_prefix_(options.strip_prefix()), add_prefix_(options.add_prefix()) {
  for (size_t i = 0; i < options.rename().size(); ++i) {
    const RenameRule& rule = options.rename()[i];
    try {
      rules_.emplace_back(std::regex(rule.pattern, std::regex::ECMAScript), rule.replacement);
    } catch (const std::regex_error& error) {
      LOCKSTEP_FAIL("load_from rename rule ", i, ": invalid regular expression '", rule.pattern, "': ", error.what());
    }
  }
}

bool KeyRemap::identity() const { return strip_prefix_.empty() && rules_.empty() && add_prefix_.empty(); }

std::string KeyRemap::apply(const std::string& key) const {
  std::string result = key;
  if (!strip_prefix_.empty() && result.rfind(strip_prefix_, 0) == 0) result = result.substr(strip_prefix_.size());
  for (const auto& [pattern, replacement] : rules_) result = std::regex_replace(result, pattern, replacement);
  return add_prefix_ + result;
}

std::map<std::string, torch::Tensor> model_weights_of_checkpoint(const State& state, const std::string& path) {
  State model = state.get("model");
  if (model.tensors.empty()) {
    LOCKSTEP_CHECK(!is_sharded_fsdp(state), path,
                   ": a sharded FSDP checkpoint: its model is split over the per-rank files beside it; save with "
                   "`strategy: {state_dict_type: full}` to use its weights outside the run");
    LOCKSTEP_FAIL(path, ": holds no model weights (no 'model/...' tensors)");
  }
  return model.tensors;
}

std::map<std::string, torch::Tensor> read_model_weights(const std::string& path) {
  if (is_index_file(path)) return read_sharded(path);
  if (is_lockstep_checkpoint(read_safetensors_header(path))) {
    return model_weights_of_checkpoint(read_checkpoint_file(path), path);
  }
  return read_safetensors_file(path).tensors;
}

PretrainedWeights read_pretrained(const PretrainedOptions& options) {
  KeyRemap remap(options);
  return remap_weights(read_model_weights(options.path()), remap, options.path());
}

std::string PretrainedReport::describe(const std::string& source) const {
  std::string text = load.describe(source);
  std::string note = renamed_note(reported_keys(load), file_keys);
  if (!note.empty()) text += (text.empty() ? "" : "\n") + note;
  return text;
}

PretrainedReport load_pretrained(Strategy& strategy, const PretrainedOptions& options) {
  const std::string& path = options.path();
  LOCKSTEP_CHECK(!path.empty(), "load_from: no path given");
  LOCKSTEP_CHECK(fs::exists(path), "load_from: ", path, " does not exist");
  KeyRemap remap(options);
  if (strategy.is_main_process()) logger().info("Loading weights from {}", path);
  PretrainedWeights weights;
  if (!is_index_file(path) && is_lockstep_checkpoint(read_safetensors_header(path))) {
    State state = read_checkpoint_file(path);
    if (is_sharded_fsdp(state)) {
      // Each rank reads its own shard file through the strategy.
      LOCKSTEP_CHECK(dynamic_cast<FSDPStrategy*>(&strategy) != nullptr, path,
                     ": a sharded FSDP checkpoint loads only into FSDPStrategy (this run uses ", strategy.name(),
                     "); save it with state_dict_type: full to load it anywhere");
      LOCKSTEP_CHECK(remap.identity(), path, ": a sharded FSDP checkpoint loads only under its own key names; "
                     "drop strip_prefix/rename/add_prefix or save it with state_dict_type: full");
      strategy.load_checkpoint(path, /*load_optimizer=*/false, /*load_schedulers=*/false, options.strict());
      return PretrainedReport();
    }
    weights = remap_weights(model_weights_of_checkpoint(state, path), remap, path);
  } else {
    weights = remap_weights(read_model_weights(path), remap, path);
  }
  PretrainedReport report;
  report.file_keys = weights.file_keys;
  // Loaded leniently first, so a strict failure can name the file keys of renamed entries too.
  report.load = strategy.load_model_state_dict(weights.tensors, /*strict=*/false, path);
  LOCKSTEP_CHECK(!options.strict() || report.load.clean(), "load_from (strict): cannot load the model weights from ",
                 path, ":\n", report.describe(path));
  report.loaded = weights.tensors.size() - report.load.unexpected.size() - report.load.mismatched.size();
  // A partial match is fine-tuning (a pretrained backbone, a new head); no
  // match at all means another model's weights (or a remapping that misses),
  // and training on would silently start from scratch.
  LOCKSTEP_CHECK(report.loaded > 0, "load_from: not one tensor of ", path,
                 " fits the model: ",
                 remap.identity() ? "it is a checkpoint of another model"
                                  : "the weights of another model, or a remapping that misses the model's names",
                 ":\n", report.describe(path));
  if (strategy.is_main_process()) {
    std::string note = renamed_note(reported_keys(report.load), report.file_keys);
    if (!note.empty()) logger().warn("{}", note);
    logger().info("Loaded {} tensors from {} ({} renamed)", report.loaded, path, report.file_keys.size());
  }
  return report;
}

PretrainedOptions parse_load_from(const Config& node, const std::string& path_override) {
  PretrainedOptions options;
  options.path(path_override);
  if (node.is_null()) return options;
  if (node.is_scalar()) {
    if (path_override.empty()) options.path(node.as<std::string>());
    return options;
  }
  LOCKSTEP_CHECK(node.is_map(), node.where(),
                 ": load_from is a path or a map {path, strip_prefix, rename, add_prefix, strict}");
  if (path_override.empty()) {
    options.path(node.get<std::string>("path"));
  } else {
    node.get<std::string>("path", "");  // read, so it is not reported as unknown
  }
  options.strip_prefix(node.get<std::string>("strip_prefix", ""))
      .add_prefix(node.get<std::string>("add_prefix", ""))
      .strict(node.get<bool>("strict", false));
  Config rename = node.child("rename");
  if (!rename.is_null()) {
    LOCKSTEP_CHECK(rename.is_sequence(), rename.where(),
                   ": rename is a list of {pattern, replacement} maps or [pattern, replacement] pairs");
    std::vector<RenameRule> rules;
    for (size_t i = 0; i < rename.size(); ++i) {
      Config entry = rename.at(i);
      RenameRule rule;
      if (entry.is_sequence()) {
        LOCKSTEP_CHECK(entry.size() == 2, entry.where(), ": a rename pair is [pattern, replacement], got ",
                       entry.size(), " entries");
        rule.pattern = entry.at(size_t{0}).as<std::string>();
        rule.replacement = entry.at(size_t{1}).as<std::string>();
      } else {
        LOCKSTEP_CHECK(entry.is_map(), entry.where(), ": a rename rule is {pattern, replacement} or [pattern, replacement]");
        rule.pattern = entry.get<std::string>("pattern");
        rule.replacement = entry.get<std::string>("replacement", "");
      }
      try {
        std::regex check(rule.pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& error) {
        LOCKSTEP_FAIL(entry.where(), ": invalid regular expression '", rule.pattern, "': ", error.what());
      }
      rules.push_back(std::move(rule));
    }
    options.rename(std::move(rules));
  }
  node.check_all_used("load_from");
  return options;
}

}  // namespace lockstep
