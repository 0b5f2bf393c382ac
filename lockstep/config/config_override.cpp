// Config::apply_override: the `--set a.b.c=value` assignments of the command line.
//
// The value is YAML, so `--set 'model.dims=[64, 32]'` sets a sequence and
// `--set 'optimizer={lr: 0.1}'` merges into the optimizer map like a child
// config would (`_delete_: true` replaces it). A null value (`--set
// train_cfg.max_epochs=null`, or nothing after '=') removes the key, so that
// a base config's choice can be taken back (mmengine's None reads as unset).
// Every error names the whole assignment, since that is what the user typed.
#include "lockstep/config/internal/config_node.h"

namespace lockstep::detail {
namespace {

using Kind = Config::Kind;

std::string trim(const std::string& text) {
  size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  size_t last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

void stamp_source(ConfigNode& node, const SourceLocation& source) {
  node.source = source;
  for (auto& entry : node.entries) stamp_source(*entry.second, source);
  for (auto& item : node.items) stamp_source(*item, source);
}

class Override {
 public:
  explicit Override(const std::string& assignment) : assignment_(assignment) {
    source_.file = "--set";
  }

  void apply(ConfigNode& root) {
    size_t equals = assignment_.find('=');
    if (equals == std::string::npos) fail("expected key=value, e.g. optimizer.lr=0.01");
    std::string key = trim(assignment_.substr(0, equals));
    std::vector<std::string> parts = split_key(key);
    for (const auto& part : parts) {
      if (part.empty()) fail("the key '", key, "' has an empty part");
    }
    NodePtr value;
    try {
      value = parse_yaml(assignment_.substr(equals + 1), "--set");
    } catch (const Error& error) {
      fail(error.what());
    }
    stamp_source(*value, source_);
    set_paths(*value, join_path(root.path, key));
    // Check `_delete_` flags on a copy first, so a bad one fails before any map is created.
    strip_delete_flags(*value->deep_copy());

    ConfigNode* node = &root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) node = &descend(*node, parts[i]);
    assign(*node, parts.back(), value);
    set_paths(*node, node->path);
  }

 private:
  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    LOCKSTEP_FAIL("--set '", assignment_, "': ", parts...);
  }

  std::string where(const ConfigNode& node) const { return location_text(node.source, node.path); }

  size_t index_into(const ConfigNode& sequence, const std::string& part) const {
    if (part.find_first_not_of("0123456789") != std::string::npos) {
      fail(where(sequence), " is a sequence; index it with a number, not '", part, "'");
    }
    size_t index = part.size() > 9 ? sequence.items.size() : std::stoul(part);
    if (index >= sequence.items.size()) {
      fail(where(sequence), " has ", sequence.items.size(), " entries; index ", part,
           " is out of range");
    }
    return index;
  }

  // One step down the key path, creating maps that are missing (or null).
  ConfigNode& descend(ConfigNode& node, const std::string& part) {
    if (node.kind == Kind::kNull) node.kind = Kind::kMap;
    if (node.kind == Kind::kSequence) return *node.items[index_into(node, part)];
    if (node.kind != Kind::kMap) fail(where(node), " is ", describe_value(node), ", not a map");
    NodePtr child = node.find(part);
    if (child == nullptr) {
      child = ConfigNode::make(Kind::kMap, source_);
      child->attached = true;
      child->path = join_path(node.path, part);
      node.put(part, child);
    }
    return *child;
  }

  void assign(ConfigNode& node, const std::string& part, const NodePtr& value) {
    if (node.kind == Kind::kNull) node.kind = Kind::kMap;
    if (node.kind == Kind::kSequence) {
      size_t index = index_into(node, part);
      strip_delete_flags(*value);
      value->attached = true;
      node.items[index]->attached = false;
      node.items[index] = value;
      return;
    }
    if (node.kind != Kind::kMap) fail(where(node), " is ", describe_value(node), ", not a map");
    if (value->kind == Kind::kNull) {
      const int index = node.index_of(part);
      if (index >= 0) {
        node.entries[static_cast<size_t>(index)].second->attached = false;
        node.entries.erase(node.entries.begin() + index);
      }
      return;
    }
    // Merged like a child config's `part: value`: maps merge, `_delete_` replaces.
    auto wrapper = ConfigNode::make(Kind::kMap, source_);
    wrapper->entries.emplace_back(part, value);
    merge_into(node, wrapper);
  }

  const std::string& assignment_;
  SourceLocation source_;
};

}  // namespace

void apply_override_to(ConfigNode& root, const std::string& assignment) {
  Override(assignment).apply(root);
}

}  // namespace lockstep::detail
