#include "lockstep/core/state.h"

#include "lockstep/core/error.h"

namespace lockstep {

void State::put(const std::string& prefix, State child) {
  for (auto& entry : child.tensors) tensors[prefix + "/" + entry.first] = std::move(entry.second);
  values[prefix] = std::move(child.values);
}

State State::get(const std::string& prefix) const {
  State child;
  const std::string lead = prefix + "/";
  for (auto it = tensors.lower_bound(lead); it != tensors.end(); ++it) {
    if (it->first.compare(0, lead.size(), lead) != 0) break;
    child.tensors[it->first.substr(lead.size())] = it->second;
  }
  if (values.is_object() && values.contains(prefix)) child.values = values.at(prefix);
  return child;
}

bool State::contains(const std::string& prefix) const {
  if (values.is_object() && values.contains(prefix)) return true;
  auto it = tensors.lower_bound(prefix + "/");
  return it != tensors.end() && it->first.compare(0, prefix.size() + 1, prefix + "/") == 0;
}

const torch::Tensor& State::tensor(const std::string& name, const std::string& what) const {
  auto found = tensors.find(name);
  LOCKSTEP_CHECK(found != tensors.end(), what, ": the checkpoint has no tensor '", name, "'");
  return found->second;
}

}  // namespace lockstep
