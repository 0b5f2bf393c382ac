// The YAML config through which `lockstep train` runs a differential case:
// one JSON case (differential_cases.h) feeds both sides, so they cannot
// drift; pytorch_reference.py reads the JSON, lockstep_config() writes the
// equivalent YAML.
//
//   std::string yaml = lockstep::differential::lockstep_config(c.reference,
//       lockstep::differential::pinned_to_cpu(c.strategy), "init.safetensors");
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace lockstep::differential {

// A case on GPU 0 ("device": "cuda"): both sides with deterministic algorithms.
bool on_gpu(const nlohmann::json& c);

// The YAML config that trains `c` with `strategy` (YAML text), starting from
// `init` (load_from).
std::string lockstep_config(const nlohmann::json& c, const std::string& strategy, const std::string& init);

// A CPU case stays on the CPU on a GPU host too: the strategy's device is
// pinned, whatever `auto` would choose there (the reference pins its side).
std::string pinned_to_cpu(const std::string& strategy);

}  // namespace lockstep::differential
