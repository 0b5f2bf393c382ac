// Config::to_yaml(): the resolved tree as block-style YAML, in insertion
// order, such that parse_config(to_yaml()) reads back the same values.
#include <yaml-cpp/yaml.h>

#include "lockstep/config/internal/config_node.h"

namespace lockstep::detail {
namespace {

using Kind = Config::Kind;

void emit(YAML::Emitter& out, const ConfigNode& node) {
  switch (node.kind) {
    case Kind::kNull:
      out << YAML::Null;
      break;
    case Kind::kScalar:
      // A quoted "0.1" or "yes" must stay a string; a plain scalar whose text
      // is a null word (built with Config::scalar("null")) is a scalar, not null.
      // yaml-cpp quotes on its own whatever is not a valid plain scalar.
      if ((node.quoted && looks_typed(node.text)) || is_null_text(node.text)) out << YAML::DoubleQuoted;
      out << node.text;
      break;
    case Kind::kSequence:
      if (node.items.empty()) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const auto& item : node.items) emit(out, *item);
      out << YAML::EndSeq;
      break;
    case Kind::kMap:
      if (node.entries.empty()) out << YAML::Flow;
      out << YAML::BeginMap;
      for (const auto& entry : node.entries) {
        out << YAML::Key;
        if (is_null_text(entry.first)) out << YAML::DoubleQuoted;
        out << entry.first << YAML::Value;
        emit(out, *entry.second);
      }
      out << YAML::EndMap;
      break;
  }
}

}  // namespace

std::string dump_yaml(const ConfigNode& node) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  out.SetIndent(2);
  emit(out, node);
  LOCKSTEP_CHECK(out.good(), "cannot write the config as YAML: ", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace lockstep::detail
