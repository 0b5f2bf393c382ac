#include "lockstep/checkpoint/pretrained.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/checkpoint/pt_file.h"
#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/checkpoint/safetensors_tools.h"
#include "lockstep/checkpoint/sharded_checkpoint.h"
#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_index_file(const std::string& path) { return ends_with(path, ".index.json"); }

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

bool is_lockstep_checkpoint_file(const std::string& path) {
  return !is_dcp_checkpoint(path) && !is_index_file(path) && !is_torch_save_file(path) &&
         is_lockstep_checkpoint(read_safetensors_header(path));
}

std::map<std::string, torch::Tensor> read_model_weights(const std::string& path) {
  if (is_dcp_checkpoint(path)) return read_dcp_state_dict(path);
  if (is_index_file(path)) return read_sharded(path);
  if (is_torch_save_file(path)) return read_pt_state_dict(path);
  if (is_lockstep_checkpoint(read_safetensors_header(path))) {
    return whole_model_weights(read_checkpoint(path), path);
  }
  return read_safetensors_file(path).tensors;
}

PretrainedSource read_pretrained(const PretrainedOptions& options) {
  const std::string& path = options.path();
  KeyRemap remap(options);
  PretrainedSource source;
  if (is_lockstep_checkpoint_file(path)) {
    CheckpointContents contents = read_checkpoint(path);
    if (is_dcp_manifest(contents)) {  // the model.* entries of its DCP directory, whole: any strategy loads them
      source.weights = remap_weights(whole_model_weights(contents, path), remap, path);
      return source;
    }
    if (contents.sharded()) {
      LOCKSTEP_CHECK(remap.identity(), path, ": a sharded FSDP checkpoint loads only under its own key names; "
                     "drop strip_prefix/rename/add_prefix or save it with state_dict_type: full");
      source.sharded_checkpoint = true;
      return source;
    }
    source.weights = remap_weights(model_weights(contents, path), remap, path);
    return source;
  }
  source.weights = remap_weights(read_model_weights(path), remap, path);
  return source;
}

std::string PretrainedReport::describe(const std::string& source) const {
  std::string text = load.describe(source);
  std::string note = renamed_note();
  if (!note.empty()) text += (text.empty() ? "" : "\n") + note;
  return text;
}

std::string PretrainedReport::renamed_note() const { return lockstep::renamed_note(reported_keys(load), file_keys); }

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
  check_all_used(node, "load_from");
  return options;
}

}  // namespace lockstep
