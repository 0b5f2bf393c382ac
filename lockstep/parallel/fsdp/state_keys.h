// How FSDP's state dicts name things: a unit's flat shard, and the
// "<group>.<index>.<buffer>" keys of optimizer state. Shared by the state
// dict conversions (fsdp_state_dict.cpp) and resharding (fsdp_reshard.cpp).
//
//   unit_key(unit)                       // "layers.0.flat_param" ("flat_param" for the root)
//   split_state_key("0.12.exp_avg", &position, &buffer)   // "0.12", "exp_avg"
#pragma once

#include <string>

#include "lockstep/parallel/fsdp/flat_param.h"

namespace lockstep::fsdp {

inline std::string unit_key(const std::string& unit_path) {
  return unit_path.empty() ? "flat_param" : unit_path + ".flat_param";
}
inline std::string unit_key(const FlatParamUnit& unit) { return unit_key(unit.path()); }

// "0.12.exp_avg" -> {"0.12", "exp_avg"}; false for other keys.
inline bool split_state_key(const std::string& key, std::string* position, std::string* buffer) {
  const size_t first = key.find('.');
  if (first == std::string::npos) return false;
  const size_t second = key.find('.', first + 1);
  if (second == std::string::npos) return false;
  *position = key.substr(0, second);
  *buffer = key.substr(second + 1);
  return true;
}

}  // namespace lockstep::fsdp
