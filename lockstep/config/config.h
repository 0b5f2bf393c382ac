// Config: a YAML configuration tree that remembers where every value came from.
//
// A whole run is one YAML file (plus `--set` overrides). Every node knows its
// file, line and key path, so any error about a value names all three:
//
//   auto cfg = lockstep::load_config("examples/fashion_mnist/cnn.yaml");
//   cfg.apply_override("optimizer.lr=0.05");         // from `--set`
//   double lr = cfg.at("optimizer").get<double>("lr");
//   int epochs = cfg.get<int>("max_epochs", 3);      // with a default
//   // A bad value throws lockstep::Error:
//   //   "cnn.yaml:14 (key optimizer.lr): expected a number, got 'fast'"
//
// Inheritance follows mmengine: `_base_: base.yaml` (or a list) is loaded first,
// relative to the including file, and the file's own maps are merged into it
// key by key; a map that says `_delete_: true` replaces the inherited one.
//
// Reads are tracked: every key read through at()/get()/has() is marked used,
// and check_all_used() (key_usage.h) names the keys nobody read (typos such
// as `momentun`).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/core/error.h"  // IWYU pragma: export (a bad value throws lockstep::Error)

namespace lockstep {

struct SourceLocation {
  std::string file;  // path of the YAML file, "--set" for overrides, or a name given to parse()
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;    // 1-based; 0 when unknown
  std::string str() const;  // "file:line" (or just "file")
};

namespace detail {
struct ConfigNode;
}

class Config {
 public:
  enum class Kind { kNull, kScalar, kSequence, kMap };

  // A null node.
  Config();

  // Applies one `a.b.c=value` override; value is parsed as YAML (so `[1, 2]`
  // and `{x: 1}` work). Missing intermediate maps are created. Sequences are
  // indexed by number: `param_scheduler.1.T_max=10`. A map value merges into
  // an existing map like a child config would (`{_delete_: true, ...}`
  // replaces it). New nodes are located at file "--set".
  void apply_override(const std::string& assignment);

  // New nodes, for building configs in code. scalar() takes YAML plain-scalar
  // text: scalar("0.1") reads as a number, scalar("yes") as true.
  static Config scalar(const std::string& text);
  static Config map();
  static Config sequence();

  Kind kind() const;
  bool is_null() const { return kind() == Kind::kNull; }
  bool is_scalar() const { return kind() == Kind::kScalar; }
  bool is_sequence() const { return kind() == Kind::kSequence; }
  bool is_map() const { return kind() == Kind::kMap; }

  // Map access. has() marks the key used when present.
  bool has(const std::string& key) const;
  // Throws "file:line (key a.b): missing key 'c'" when absent.
  Config at(const std::string& key) const;
  // Returns a null node (with the would-be path) when absent. Reading through
  // it (as<T>(), at()) throws the "missing key" error of the first absent key.
  Config child(const std::string& key) const;
  std::vector<std::string> keys() const;

  // Sequence access.
  size_t size() const;  // entries of a sequence or map; 0 for scalars and null
  Config at(size_t index) const;

  // Scalar conversion. Supported T: bool, int, int64_t, double, float,
  // std::string, and std::vector<T> of those (from a sequence).
  // Throws "file:line (key a.b): expected <what>, got '<text>'".
  // The text decides, by YAML's core schema: bool is true/false/yes/no/on/off
  // (lower, Title or UPPER case); integers are decimal, 0x hex or 0o octal and
  // must fit T (1.5 is not an int); numbers add decimals, exponents and
  // .inf/.nan. A quoted "0.5" reads as 0.5 too. An element of a vector that
  // fails names its own line and path ("betas.1").
  template <typename T>
  T as() const;
  template <typename T>
  T get(const std::string& key) const {
    return at(key).as<T>();
  }
  template <typename T>
  T get(const std::string& key, const T& fallback) const {
    Config value = child(key);
    return value.is_null() ? fallback : value.as<T>();
  }
  // The raw scalar text (for error messages and registries).
  const std::string& text() const;

  // Where the node came from: "cnn.yaml:12 (key optimizer.lr)".
  std::string where() const;
  // Where `key` of this map is (or would be): uses the child's line if present.
  std::string where(const std::string& key) const;
  const std::string& path() const;
  SourceLocation source() const;

  // Mutation: replaces or adds a child. The child keeps its own source.
  // A node that is not yet in a tree (Config::map(), a clone) is inserted
  // itself, so later edits through its handle show; a node that already sits
  // in a tree is cloned first. set() on a null node makes it a map, and
  // push_back() a sequence.
  void set(const std::string& key, const Config& value);
  void push_back(const Config& value);
  void erase(const std::string& key);

  // A deep copy (reads of the copy are tracked separately).
  Config clone() const;
  // Block-style YAML of the resolved tree (what gets written to the work dir).
  std::string to_yaml() const;

  // Whether both handles are one node of one tree.
  friend bool same_node(const Config& a, const Config& b) { return a.node_ == b.node_; }

 private:
  explicit Config(std::shared_ptr<detail::ConfigNode> node);
  std::shared_ptr<detail::ConfigNode> node_;
  friend struct detail::ConfigNode;
};

// Loads a YAML file, resolving `_base_` and `_delete_`.
Config load_config(const std::string& path);
// Parses YAML text; `source_name` stands in for the file name in messages
// (and its directory anchors a `_base_`). Any kind of root is accepted.
Config parse_config(const std::string& yaml_text, const std::string& source_name = "<string>");

// as<T>() is defined (explicitly instantiated) in config_convert.cpp for these.
extern template bool Config::as<bool>() const;
extern template int Config::as<int>() const;
extern template int64_t Config::as<int64_t>() const;
extern template double Config::as<double>() const;
extern template float Config::as<float>() const;
extern template std::string Config::as<std::string>() const;
extern template std::vector<bool> Config::as<std::vector<bool>>() const;
extern template std::vector<int> Config::as<std::vector<int>>() const;
extern template std::vector<int64_t> Config::as<std::vector<int64_t>>() const;
extern template std::vector<double> Config::as<std::vector<double>>() const;
extern template std::vector<float> Config::as<std::vector<float>>() const;
extern template std::vector<std::string> Config::as<std::vector<std::string>>() const;

}  // namespace lockstep
