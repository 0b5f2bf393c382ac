// Config's tree access and mutation. Loading lives in yaml_loader.cpp, the
// checks of what was read in key_usage.cpp, overrides in config_override.cpp, as<T>() in
// config_convert.cpp, to_yaml() in yaml_dumper.cpp.
#include "lockstep/config/config.h"

#include <algorithm>
#include <functional>

#include "lockstep/config/internal/config_node.h"

namespace lockstep {

using detail::ConfigNode;
using detail::NodePtr;

std::string SourceLocation::str() const {
  if (line <= 0) return file;
  return str_cat(file, ":", line);
}

namespace detail {

NodePtr ConfigNode::find(const std::string& key) const {
  for (const auto& entry : entries) {
    if (entry.first == key) return entry.second;
  }
  return nullptr;
}

int ConfigNode::index_of(const std::string& key) const {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].first == key) return static_cast<int>(i);
  }
  return -1;
}

void ConfigNode::put(const std::string& key, NodePtr value) {
  int index = index_of(key);
  if (index >= 0) {
    entries[index].second->attached = false;
    entries[index].second = std::move(value);
  } else {
    entries.emplace_back(key, std::move(value));
  }
}

NodePtr ConfigNode::deep_copy() const {
  auto copy = std::make_shared<ConfigNode>();
  copy->kind = kind;
  copy->text = text;
  copy->quoted = quoted;
  copy->source = source;
  copy->path = path;
  copy->missing = missing;
  for (const auto& entry : entries) {
    copy->entries.emplace_back(entry.first, entry.second->deep_copy());
    copy->entries.back().second->attached = true;
  }
  for (const auto& item : items) {
    copy->items.push_back(item->deep_copy());
    copy->items.back()->attached = true;
  }
  return copy;
}

NodePtr ConfigNode::make(Config::Kind kind, SourceLocation source) {
  auto node = std::make_shared<ConfigNode>();
  node->kind = kind;
  node->source = std::move(source);
  return node;
}

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

void set_paths(ConfigNode& node, const std::string& path) {
  node.path = path;
  for (auto& entry : node.entries) set_paths(*entry.second, join_path(path, entry.first));
  for (size_t i = 0; i < node.items.size(); ++i) {
    set_paths(*node.items[i], join_path(path, std::to_string(i)));
  }
}

std::string location_text(const SourceLocation& source, const std::string& path) {
  std::string where = source.str();
  if (path.empty()) return where.empty() ? "<config>" : where;
  return where.empty() ? str_cat("(key ", path, ")") : str_cat(where, " (key ", path, ")");
}

std::string describe_value(const ConfigNode& node) {
  switch (node.kind) {
    case Config::Kind::kNull:
      return node.missing ? "nothing (the key is absent)" : "null";
    case Config::Kind::kScalar:
      return str_cat("'", node.text, "'");
    case Config::Kind::kSequence:
      return "a sequence";
    case Config::Kind::kMap:
      return "a map";
  }
  return "?";
}

void throw_missing(const ConfigNode& absent) {
  const std::string& path = absent.path;
  auto dot = path.rfind('.');
  std::string parent = dot == std::string::npos ? std::string() : path.substr(0, dot);
  std::string key = dot == std::string::npos ? path : path.substr(dot + 1);
  LOCKSTEP_FAIL(location_text(absent.source, parent), ": missing key '", key, "'");
}

}  // namespace detail

namespace {

const char* kind_name(Config::Kind kind) {
  switch (kind) {
    case Config::Kind::kNull:
      return "null";
    case Config::Kind::kScalar:
      return "a scalar";
    case Config::Kind::kSequence:
      return "a sequence";
    case Config::Kind::kMap:
      return "a map";
  }
  return "?";
}

// True when `target` is `root` or lies under it: inserting root below target
// would make the tree a cycle.
bool contains_node(const ConfigNode& root, const ConfigNode* target) {
  if (&root == target) return true;
  for (const auto& entry : root.entries) {
    if (contains_node(*entry.second, target)) return true;
  }
  for (const auto& item : root.items) {
    if (contains_node(*item, target)) return true;
  }
  return false;
}

}  // namespace

Config::Config() : node_(ConfigNode::make(Kind::kNull)) {}

Config::Config(std::shared_ptr<detail::ConfigNode> node) : node_(std::move(node)) {}

Config load_config(const std::string& path) { return ConfigNode::wrap(detail::load_config_file(path)); }

Config parse_config(const std::string& yaml_text, const std::string& source_name) {
  return ConfigNode::wrap(detail::load_config_text(yaml_text, source_name));
}

void Config::apply_override(const std::string& assignment) {
  detail::apply_override_to(*node_, assignment);
}

Config Config::scalar(const std::string& text) {
  auto node = ConfigNode::make(Kind::kScalar);
  node->text = text;
  return Config(node);
}

Config Config::map() { return Config(ConfigNode::make(Kind::kMap)); }

Config Config::sequence() { return Config(ConfigNode::make(Kind::kSequence)); }

Config::Kind Config::kind() const { return node_->kind; }

bool Config::has(const std::string& key) const {
  if (node_->kind != Kind::kMap) return false;
  node_->requested.insert(key);
  NodePtr child = node_->find(key);
  if (child == nullptr) return false;
  child->used = true;
  return true;
}

Config Config::at(const std::string& key) const {
  if (node_->kind == Kind::kMap) node_->requested.insert(key);
  NodePtr child = node_->kind == Kind::kMap ? node_->find(key) : nullptr;
  if (child != nullptr) {
    child->used = true;
    return Config(child);
  }
  // A chain through an absent key reports the first absent one.
  if (node_->missing) detail::throw_missing(*node_);
  LOCKSTEP_CHECK(node_->kind == Kind::kMap || node_->kind == Kind::kNull, where(),
                 ": expected a map with key '", key, "', got ", detail::describe_value(*node_));
  LOCKSTEP_FAIL(where(), ": missing key '", key, "'");
}

Config Config::child(const std::string& key) const {
  LOCKSTEP_CHECK(node_->kind == Kind::kMap || node_->kind == Kind::kNull, where(),
                 ": expected a map with key '", key, "', got ", detail::describe_value(*node_));
  if (node_->kind == Kind::kMap) {
    node_->requested.insert(key);
    if (NodePtr found = node_->find(key)) {
      found->used = true;
      return Config(found);
    }
  }
  auto absent = ConfigNode::make(Kind::kNull, node_->source);
  absent->path = detail::join_path(node_->path, key);
  absent->missing = true;
  return Config(absent);
}

std::vector<std::string> Config::keys() const {
  std::vector<std::string> result;
  for (const auto& entry : node_->entries) result.push_back(entry.first);
  return result;
}

size_t Config::size() const {
  if (node_->kind == Kind::kMap) return node_->entries.size();
  if (node_->kind == Kind::kSequence) return node_->items.size();
  return 0;
}

Config Config::at(size_t index) const {
  LOCKSTEP_CHECK(node_->kind == Kind::kSequence, where(), ": expected a sequence, got ",
                 detail::describe_value(*node_));
  LOCKSTEP_CHECK(index < node_->items.size(), where(), ": index ", index,
                 " is out of range for a sequence of ", node_->items.size(), " entries");
  node_->items[index]->used = true;
  return Config(node_->items[index]);
}

const std::string& Config::text() const { return node_->text; }

std::string Config::where() const { return detail::location_text(node_->source, node_->path); }

std::string Config::where(const std::string& key) const {
  if (node_->kind == Kind::kMap) {
    if (NodePtr found = node_->find(key)) return detail::location_text(found->source, found->path);
  }
  return detail::location_text(node_->source, detail::join_path(node_->path, key));
}

const std::string& Config::path() const { return node_->path; }

SourceLocation Config::source() const { return node_->source; }

namespace {

// The node to insert for `value`: the node itself when it is free, a clone
// when it already sits in a tree (or would close a cycle).
NodePtr adopt(const NodePtr& parent, const NodePtr& value) {
  NodePtr node = value;
  if (value->attached || contains_node(*value, parent.get())) node = value->deep_copy();
  node->attached = true;
  node->missing = false;
  return node;
}

}  // namespace

void Config::set(const std::string& key, const Config& value) {
  if (node_->kind == Kind::kNull) {
    node_->kind = Kind::kMap;
    node_->missing = false;
  }
  LOCKSTEP_CHECK(node_->kind == Kind::kMap, where(), ": cannot set key '", key, "' on ",
                 kind_name(node_->kind));
  NodePtr node = adopt(node_, value.node_);
  detail::set_paths(*node, detail::join_path(node_->path, key));
  node_->put(key, node);
}

void Config::push_back(const Config& value) {
  if (node_->kind == Kind::kNull) {
    node_->kind = Kind::kSequence;
    node_->missing = false;
  }
  LOCKSTEP_CHECK(node_->kind == Kind::kSequence, where(), ": cannot append to ",
                 kind_name(node_->kind));
  NodePtr node = adopt(node_, value.node_);
  detail::set_paths(*node, detail::join_path(node_->path, std::to_string(node_->items.size())));
  node_->items.push_back(node);
}

void Config::erase(const std::string& key) {
  if (node_->kind == Kind::kNull) return;
  LOCKSTEP_CHECK(node_->kind == Kind::kMap, where(), ": cannot erase key '", key, "' from ",
                 kind_name(node_->kind));
  int index = node_->index_of(key);
  if (index < 0) return;
  node_->entries[index].second->attached = false;
  node_->entries.erase(node_->entries.begin() + index);
}

Config Config::clone() const { return Config(node_->deep_copy()); }

std::string Config::to_yaml() const { return detail::dump_yaml(*node_); }

}  // namespace lockstep
