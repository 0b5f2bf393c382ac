// State: what a component saves into a checkpoint and loads back.
//
// Tensors go by name into `tensors`; everything else (counters, learning
// rates, names, flags) goes into the JSON object `values`. Components nest
// their children under a prefix, and the checkpoint file stores the whole tree
// (see checkpoint/checkpoint_file.h).
//
//   lockstep::State state;
//   state.values["last_epoch"] = last_epoch_;
//   state.tensors["momentum_buffer.3"] = buffer;
//   parent.put("scheduler.0", std::move(state));
//   lockstep::State mine = parent.get("scheduler.0");
//
// Doubles in `values` round-trip exactly (nlohmann::json prints 17 digits),
// which the bitwise resume guarantee relies on.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/types.h>

namespace lockstep {

struct State {
  std::map<std::string, torch::Tensor> tensors;
  nlohmann::json values = nlohmann::json::object();

  bool empty() const { return tensors.empty() && (values.is_null() || values.empty()); }

  // Stores `child` under `prefix`: its tensors as "prefix/name", its values as values[prefix].
  void put(const std::string& prefix, State child);
  // The part stored under `prefix` by put(); empty when absent.
  State get(const std::string& prefix) const;
  bool contains(const std::string& prefix) const;
  // The tensor `name`, or an error naming `what` (e.g. "optimizer state") and the key.
  const torch::Tensor& tensor(const std::string& name, const std::string& what) const;
};

}  // namespace lockstep
