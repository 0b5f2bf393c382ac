// Internal to lockstep/config: the node tree behind Config, and the functions
// the config sources share (loading, merging, overrides, conversion, dumping).
//
// Config is a handle (shared_ptr) to a ConfigNode, so a child obtained through
// at() is the node inside the tree, and marking it used is visible from the
// root. Every node keeps its own SourceLocation, which is why a tree merged
// from several files still names the right file and line for each value.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/config/config.h"

namespace lockstep::detail {

struct ConfigNode;
using NodePtr = std::shared_ptr<ConfigNode>;

struct ConfigNode {
  Config::Kind kind = Config::Kind::kNull;
  std::string text;     // the scalar's text (kScalar only)
  bool quoted = false;  // written quoted (or tagged) in YAML: a string whatever it looks like
  std::vector<std::pair<std::string, NodePtr>> entries;  // kMap, in insertion order
  std::vector<NodePtr> items;                            // kSequence
  SourceLocation source;
  std::string path;      // "optimizer.lr", "param_scheduler.1.end"; "" for a root
  bool missing = false;  // the null stand-in child() returns for an absent key
  bool attached = false;  // sits inside some tree: set() inserts a clone of it instead
  // Read tracking, for check_all_used(). `requested` holds every key looked up
  // on this map, present or not: the keys a component knows, the typo hint.
  mutable bool used = false;
  mutable std::set<std::string> requested;

  // Linear search: config maps are small and keep insertion order.
  NodePtr find(const std::string& key) const;
  // Index of `key` in entries, or -1.
  int index_of(const std::string& key) const;
  // Replaces `key` in place, or appends it.
  void put(const std::string& key, NodePtr value);
  // A deep copy with fresh tracking; sources and paths are kept.
  NodePtr deep_copy() const;

  static NodePtr make(Config::Kind kind, SourceLocation source = {});
  static Config wrap(NodePtr node) { return Config(std::move(node)); }
  static const NodePtr& unwrap(const Config& config) { return config.node_; }
};

std::string join_path(const std::string& parent, const std::string& key);
// Rewrites `path` of node and of everything under it.
void set_paths(ConfigNode& node, const std::string& path);
// "file:12 (key a.b)", "file (key a.b)", "(key a.b)" or "file:12".
std::string location_text(const SourceLocation& source, const std::string& path);
// Throws "file:line (key a.b): missing key 'c'" for the stand-in of absent a.b.c.
[[noreturn]] void throw_missing(const ConfigNode& absent);
// "'fast'", "a map", "a sequence", "null": what a type error says it got.
std::string describe_value(const ConfigNode& node);

// ---- yaml_loader.cpp ------------------------------------------------------
// Parses YAML text into a tree (no `_base_` handling). Parse errors read
// "<file>:<line>:<col>: <yaml-cpp's message>".
NodePtr parse_yaml(const std::string& text, const std::string& file);
// Parses and resolves `_base_` relative to the directory of `file`.
NodePtr load_config_text(const std::string& text, const std::string& file);
NodePtr load_config_file(const std::string& path);
// Merges map `src` into map `dst` the mmengine way: maps merge key by key,
// a map with `_delete_: true` replaces, sequences and scalars replace.
// `_delete_` keys are consumed. Nodes of src move into dst.
void merge_into(ConfigNode& dst, const NodePtr& src);
// Checks and drops `_delete_` keys in a subtree that has nothing to replace.
void strip_delete_flags(ConfigNode& node);

// ---- config_override.cpp --------------------------------------------------
void apply_override_to(ConfigNode& root, const std::string& assignment);

// ---- config_convert.cpp ---------------------------------------------------
// Scalar grammar shared by as<T>() and the dumper (which must quote strings
// that these would read as something else).
bool parse_bool_text(const std::string& text, bool* value);
bool is_null_text(const std::string& text);
bool looks_typed(const std::string& text);

// ---- yaml_dumper.cpp ------------------------------------------------------
std::string dump_yaml(const ConfigNode& node);

}  // namespace lockstep::detail
