// YAML text and files into ConfigNode trees, with mmengine's `_base_` and
// `_delete_`. yaml-cpp parses; every node is copied into lockstep's own tree
// together with its file and line, so merged trees keep each value's origin.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "lockstep/config/internal/config_node.h"

namespace lockstep::detail {
namespace {

namespace fs = std::filesystem;
using Kind = Config::Kind;

SourceLocation location_of(const std::string& file, const YAML::Mark& mark) {
  SourceLocation location;
  location.file = file;
  if (!mark.is_null()) {
    location.line = mark.line + 1;
    location.column = mark.column + 1;
  }
  return location;
}

// A map entry is located at its key: for `optimizer:` followed by an indented
// block, the key's line is the one a reader looks for.
NodePtr convert(const YAML::Node& yaml, const std::string& file, const SourceLocation& location,
                const std::string& path) {
  auto node = ConfigNode::make(Kind::kNull, location);
  node->path = path;
  switch (yaml.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      break;
    case YAML::NodeType::Scalar:
      node->kind = Kind::kScalar;
      node->text = yaml.Scalar();
      // "?" is yaml-cpp's tag for a plain scalar; quoted ones get "!".
      node->quoted = yaml.Tag() != "?";
      break;
    case YAML::NodeType::Sequence: {
      node->kind = Kind::kSequence;
      for (const auto& item : yaml) {
        SourceLocation item_location =
            item.Mark().is_null() ? location : location_of(file, item.Mark());
        node->items.push_back(convert(item, file, item_location,
                                      join_path(path, std::to_string(node->items.size()))));
        node->items.back()->attached = true;
      }
      break;
    }
    case YAML::NodeType::Map: {
      node->kind = Kind::kMap;
      std::unordered_map<std::string, int> first_line;
      for (const auto& entry : yaml) {
        SourceLocation key_location = location_of(file, entry.first.Mark());
        LOCKSTEP_CHECK(entry.first.IsScalar(), location_text(key_location, path),
                       ": a map key must be a plain text, got ",
                       entry.first.IsNull() ? "an empty key" : "a map or sequence");
        const std::string& key = entry.first.Scalar();
        auto inserted = first_line.emplace(key, key_location.line);
        LOCKSTEP_CHECK(inserted.second, key_location.str(), ": duplicate key '", key,
                       "' (first at line ", inserted.first->second, ")");
        node->entries.emplace_back(key, convert(entry.second, file, key_location, join_path(path, key)));
        node->entries.back().second->attached = true;
      }
      break;
    }
  }
  return node;
}

// Removes `_delete_` from a map and returns its value.
bool take_delete_flag(ConfigNode& node) {
  int index = node.index_of("_delete_");
  if (index < 0) return false;
  const ConfigNode& flag = *node.entries[index].second;
  bool value = false;
  LOCKSTEP_CHECK(flag.kind == Kind::kScalar && parse_bool_text(flag.text, &value),
                 location_text(flag.source, flag.path), ": _delete_ must be true or false, got ",
                 describe_value(flag));
  node.entries.erase(node.entries.begin() + index);
  return value;
}

std::string read_text_file(const std::string& path, const std::string& included_from) {
  std::string context = included_from.empty() ? std::string()
                                              : str_cat(" (named in _base_ at ", included_from, ")");
  std::error_code error;
  fs::file_status status = fs::status(path, error);
  LOCKSTEP_CHECK(fs::exists(status), "cannot open config file '", path, "'", context,
                 ": no such file");
  LOCKSTEP_CHECK(fs::is_regular_file(status), "cannot open config file '", path, "'", context,
                 ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  LOCKSTEP_CHECK(in.good() || in.eof(), "cannot read config file '", path, "'", context);
  return text.str();
}

// Loads files and resolves their `_base_` chains; `stack_` holds the files
// being loaded, so a file that (indirectly) includes itself is named.
class BaseResolver {
 public:
  NodePtr load_file(const std::string& path, const std::string& included_from) {
    std::error_code error;
    std::string canonical = fs::weakly_canonical(path, error).string();
    if (error) canonical = fs::path(path).lexically_normal().string();
    for (size_t i = 0; i < stack_.size(); ++i) {
      if (stack_[i].canonical != canonical) continue;
      std::string chain;
      for (size_t j = i; j < stack_.size(); ++j) chain += stack_[j].shown + " -> ";
      LOCKSTEP_FAIL(included_from, ": _base_ include cycle: ", chain, path);
    }
    NodePtr root = parse_yaml(read_text_file(path, included_from), path);
    if (root->kind == Kind::kNull) root->kind = Kind::kMap;  // an empty file
    LOCKSTEP_CHECK(root->kind == Kind::kMap, path, ": a config file holds a map at the top, got ",
                   describe_value(*root));
    stack_.push_back({canonical, path});
    NodePtr result = resolve(root, path);
    stack_.pop_back();
    return result;
  }

  // Merges the bases named by root's `_base_` (relative to `file`) under root.
  NodePtr resolve(const NodePtr& root, const std::string& file) {
    int index = root->kind == Kind::kMap ? root->index_of("_base_") : -1;
    if (index < 0) {
      strip_delete_flags(*root);
      return root;
    }
    NodePtr bases = root->entries[index].second;
    root->entries.erase(root->entries.begin() + index);
    LOCKSTEP_CHECK(bases->kind != Kind::kMap, location_text(bases->source, bases->path),
                   ": _base_ holds a file name or a list of file names, got a map");
    std::vector<NodePtr> names;
    if (bases->kind == Kind::kScalar) names.push_back(bases);
    if (bases->kind == Kind::kSequence) names = bases->items;
    auto result = ConfigNode::make(Kind::kMap, root->source);
    for (const auto& name : names) {
      LOCKSTEP_CHECK(name->kind == Kind::kScalar && !name->text.empty(), location_text(name->source, name->path),
                     ": _base_ holds a file name or a list of file names, got ", describe_value(*name));
      fs::path base(name->text);
      if (base.is_relative()) base = fs::path(file).parent_path() / base;
      merge_into(*result, load_file(base.lexically_normal().string(), name->source.str()));
    }
    // A top-level `_delete_: true` drops everything the bases defined.
    if (take_delete_flag(*root)) result->entries.clear();
    merge_into(*result, root);
    set_paths(*result, root->path);
    return result;
  }

 private:
  struct Entry {
    std::string canonical;
    std::string shown;
  };
  std::vector<Entry> stack_;
};

}  // namespace

// Counts the documents of `text`, stopping at `limit`. yaml-cpp 0.7's
// LoadAll never returns on a stray ',' outside brackets ("--set a=,"): it
// keeps producing empty documents until memory runs out.
size_t count_documents(const std::string& text, size_t limit) {
  struct Ignore : YAML::EventHandler {
    void OnDocumentStart(const YAML::Mark&) override {}
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  } ignore;
  std::stringstream stream(text);
  YAML::Parser parser(stream);
  size_t count = 0;
  while (count < limit && parser.HandleNextDocument(ignore)) ++count;
  return count;
}

NodePtr parse_yaml(const std::string& text, const std::string& file) {
  std::vector<YAML::Node> documents;
  try {
    const size_t count = count_documents(text, 2);
    LOCKSTEP_CHECK(count <= 1, file, ": holds more than one YAML document (a '---' separator, or a ',' outside "
                   "brackets?); a config is one");
    if (count == 1) documents.push_back(YAML::Load(text));
  } catch (const YAML::Exception& error) {
    if (error.mark.is_null()) LOCKSTEP_FAIL(file, ": ", error.msg);
    LOCKSTEP_FAIL(file, ":", error.mark.line + 1, ":", error.mark.column + 1, ": ", error.msg);
  }
  LOCKSTEP_CHECK(documents.size() <= 1, file, ": holds ", documents.size(),
                 " YAML documents; a config is one");
  SourceLocation root_location;
  root_location.file = file;
  if (documents.empty()) return ConfigNode::make(Kind::kNull, root_location);
  return convert(documents.front(), file, root_location, "");
}

NodePtr load_config_text(const std::string& text, const std::string& file) {
  return BaseResolver().resolve(parse_yaml(text, file), file);
}

NodePtr load_config_file(const std::string& path) { return BaseResolver().load_file(path, ""); }

void strip_delete_flags(ConfigNode& node) {
  if (node.kind == Kind::kMap) take_delete_flag(node);
  for (auto& entry : node.entries) strip_delete_flags(*entry.second);
  for (auto& item : node.items) strip_delete_flags(*item);
}

void merge_into(ConfigNode& dst, const NodePtr& src) {
  for (auto& entry : src->entries) {
    const NodePtr& value = entry.second;
    NodePtr existing = dst.find(entry.first);
    // take_delete_flag runs for every map value, so the flag never survives.
    bool replace = value->kind != Kind::kMap || take_delete_flag(*value) || existing == nullptr ||
                   existing->kind != Kind::kMap;
    if (!replace) {
      merge_into(*existing, value);
      continue;
    }
    strip_delete_flags(*value);
    value->attached = true;
    dst.put(entry.first, value);
  }
}

}  // namespace lockstep::detail
