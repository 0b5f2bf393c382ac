// Internal to optimizer_state.cpp: the codec for optimizer types that have
// no typed one (Note [Generic optimizer state] in optimizer_state_generic.cpp),
// and the helpers both codecs share. Use lockstep/optim/optimizer_state.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include "lockstep/core/state.h"
#include "lockstep/optim/param_groups.h"

namespace lockstep::detail {

// "<group>.<index>", a parameter's place in the optimizer.
std::string position(size_t group, size_t index);
// Parses "g.i" into its two numbers; false when malformed.
bool parse_position(const std::string& text, size_t* group, size_t* index);
// The (group, index) that "g.i", a checkpoint's key, names; it must be a
// parameter of `param_groups`.
std::pair<size_t, size_t> checked_position(const std::string& text,
                                           const std::vector<torch::optim::OptimizerParamGroup>& param_groups);
// Throws when a checkpoint's group count is not the optimizer's, saying
// why a checkpoint from before one group per parameter may have fewer.
void check_group_count(const char* what, size_t saved, size_t now);
// "group 1, parameter 3 (backbone.conv.weight)"; the name when `groups` has it.
std::string describe(size_t group, size_t index, const std::vector<ParamGroupInfo>* groups);
// values[key], which must exist and be of `kind`.
const nlohmann::json& value_at(const nlohmann::json& values, const char* key, nlohmann::json::value_t kind);

// What a codec says of one group: its options as JSON.
using GroupOptionsJson = std::function<nlohmann::json(size_t group)>;
// What a codec says of one parameter that has state: its entry's values, and
// its tensors into `buffers` by key.
using ParamStateJson = std::function<nlohmann::json(size_t group, size_t index, const torch::Tensor& param,
                                                    const torch::optim::OptimizerParamState& state,
                                                    std::map<std::string, torch::Tensor>& buffers)>;
// The State both codecs save: values {"type", "groups": [{num_params, options}],
// "params": {"g.i": entry}} and tensors "g.i.<key>", for the parameters that
// have state.
State save_state(const torch::optim::Optimizer& optimizer, const std::string& type,
                 const GroupOptionsJson& options_of, const ParamStateJson& state_of);

State save_generic(const torch::optim::Optimizer& optimizer);
void load_generic(torch::optim::Optimizer& optimizer, const State& state, const std::vector<ParamGroupInfo>* names);
int64_t generic_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace lockstep::detail
