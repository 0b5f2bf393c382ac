#include "lockstep/core/load_report.h"

#include <algorithm>
#include <map>

namespace lockstep {
namespace {

// "conv1.weight, conv1.bias, fc.weight" -> "conv1.{bias, weight}, fc.weight"
std::string group_by_prefix(std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end());
  std::map<std::string, std::vector<std::string>> groups;
  std::vector<std::string> order;
  for (const auto& key : keys) {
    auto dot = key.rfind('.');
    std::string prefix = dot == std::string::npos ? "" : key.substr(0, dot);
    std::string leaf = dot == std::string::npos ? key : key.substr(dot + 1);
    if (groups.count(prefix) == 0) order.push_back(prefix);
    groups[prefix].push_back(leaf);
  }
  std::string text;
  for (const auto& prefix : order) {
    const auto& leaves = groups[prefix];
    text += "\n  ";
    if (prefix.empty()) {
      for (size_t i = 0; i < leaves.size(); ++i) text += (i ? ", " : "") + leaves[i];
    } else if (leaves.size() == 1) {
      text += prefix + "." + leaves[0];
    } else {
      text += prefix + ".{";
      for (size_t i = 0; i < leaves.size(); ++i) text += (i ? ", " : "") + leaves[i];
      text += "}";
    }
  }
  return text;
}

}  // namespace

std::string LoadReport::describe(const std::string& source) const {
  std::string text;
  if (!mismatched.empty()) {
    text += "Skipped loading parameters of " + source + " whose shape differs:";
    for (const auto& entry : mismatched) text += "\n  " + entry;
    text += "\n";
  }
  if (!missing.empty()) text += "Some model parameters or buffers are not in " + source + ":" + group_by_prefix(missing) + "\n";
  if (!unexpected.empty()) text += source + " holds keys the model does not use:" + group_by_prefix(unexpected) + "\n";
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace lockstep
