// The checks of which keys a config's readers read (key_usage.h): each
// node records whether it was read and which keys were looked up beside it
// (internal/config_node.h); these walk those records.
#include "lockstep/config/key_usage.h"

#include <algorithm>

#include "lockstep/config/internal/config_node.h"
#include "lockstep/core/spelling.h"

namespace lockstep {

using detail::ConfigNode;

namespace {

void mark_subtree(const ConfigNode& node) {
  node.used = true;
  for (const auto& entry : node.entries) mark_subtree(*entry.second);
  for (const auto& item : node.items) mark_subtree(*item);
}

// One line per unread key under `node`, each naming the keys that were read
// beside it.
void collect_unused(const ConfigNode& node, const std::string& component,
                    std::vector<std::string>& problems) {
  if (node.kind == Config::Kind::kMap) {
    std::string known;
    for (const auto& key : node.requested) known += (known.empty() ? "" : ", ") + key;
    for (const auto& entry : node.entries) {
      const ConfigNode& child = *entry.second;
      if (child.used) {
        collect_unused(child, component, problems);
      } else {
        const std::vector<std::string> candidates(node.requested.begin(), node.requested.end());
        problems.push_back(str_cat(detail::location_text(child.source, child.path), ": unknown key for ",
                                   component, did_you_mean(entry.first, candidates), "; it reads: ",
                                   known.empty() ? "(no keys here)" : known));
      }
    }
  } else if (node.kind == Config::Kind::kSequence) {
    for (const auto& item : node.items) {
      if (item->used) {
        collect_unused(*item, component, problems);
      } else {
        problems.push_back(str_cat(detail::location_text(item->source, item->path),
                                   ": entry never read by ", component));
      }
    }
  }
}

}  // namespace

void check_all_used(const Config& config, const std::string& component) {
  std::vector<std::string> problems;
  collect_unused(*ConfigNode::unwrap(config), component, problems);
  if (problems.empty()) return;
  if (problems.size() == 1) throw Error(problems.front());
  std::string message = str_cat(problems.size(), " unknown keys for ", component, ":");
  for (const auto& problem : problems) message += "\n  " + problem;
  throw Error(message);
}

void check_known_keys(const Config& config, const std::vector<std::string>& known, const std::string& component) {
  const ConfigNode& node = *ConfigNode::unwrap(config);
  if (node.kind != Config::Kind::kMap) return;
  std::vector<std::string> problems;
  std::string listed;
  for (const auto& key : known) listed += (listed.empty() ? "" : ", ") + key;
  for (const auto& entry : node.entries) {
    if (std::find(known.begin(), known.end(), entry.first) != known.end()) continue;
    const ConfigNode& child = *entry.second;
    problems.push_back(str_cat(detail::location_text(child.source, child.path), ": unknown ", component,
                               did_you_mean(entry.first, known), "; known keys: ", listed));
  }
  if (problems.empty()) return;
  if (problems.size() == 1) throw Error(problems.front());
  std::string message = str_cat(problems.size(), " unknown ", component, "s:");
  for (const auto& problem : problems) message += "\n  " + problem;
  throw Error(message);
}

void mark_used(const Config& config) { mark_subtree(*ConfigNode::unwrap(config)); }

}  // namespace lockstep
