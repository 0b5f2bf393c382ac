// Optimizer state for checkpoints, keyed by parameter position.
//
// libtorch keys an optimizer's per-parameter state by the address of the
// parameter's TensorImpl, which means nothing in another process. A checkpoint
// instead names each buffer by the parameter's place in the optimizer,
// "<group>.<index>.<buffer>", and keeps each group's options, so that a fresh
// optimizer over the same model (same groups, same order) resumes bitwise:
//
//   lockstep::State saved = lockstep::save_optimizer_state(*optimizer);
//   // ... written to a checkpoint, read back in another run ...
//   lockstep::load_optimizer_state(*fresh_optimizer, saved, &group_info);
//   int64_t bytes = lockstep::optimizer_state_bytes(*optimizer);   // for memory statistics
//
// Any optimizer type. SGD, Adam, AdamW and RMSprop (and their subclasses,
// such as lockstep::Adam) have typed codecs; every other type (Adagrad, a
// type of your own) goes through libtorch's own serialisation hooks, its
// ParamState's and Options' serialize() and the optimizer's load(), which
// libtorch's optimizers implement and yours must too (the error says how;
// Note [Generic optimizer state] in the .cpp). Layout of the State:
//   tensors  "0.3.momentum_buffer" (SGD), "0.3.exp_avg", "0.3.exp_avg_sq",
//            "0.3.max_exp_avg_sq" (Adam/AdamW with amsgrad), "0.3.square_avg",
//            "0.3.momentum_buffer", "0.3.grad_avg" (RMSprop), "0.3.sum" (Adagrad):
//            for other types, each tensor its ParamState serialises, under the
//            key it serialises it with; each has the parameter's shape or none
//   values   {"type": "Adam",
//             "groups": [{"num_params": 4, "options": {"lr": ..., "betas": [b1, b2], ...}}, ...],
//             "params": {"0.3": {"step": 12}, ...}}   // one entry per parameter that has state
//            other types: "type" is optimizer_type_name(); options and the
//            params entries hold what serialize() writes that is no tensor:
//            numbers, bools, strings, null, and tuples and lists of them as
//            {"__tuple__": [b1, b2]} and {"__list__": [...], "__element__": "float"}
//
// The typed codecs' saved tensors alias the optimizer's live buffers (no copy,
// as PyTorch's state_dict does): serialise them before the next optimizer
// step. Other types' are copies. Loading copies them onto each parameter's
// device (and, for the typed codecs, its dtype), so the loaded optimizer
// never shares memory with the State.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/optim/optimizer.h>

#include "lockstep/core/state.h"
#include "lockstep/optim/param_groups.h"

namespace lockstep {

// Throws, naming the type, group, parameter and key, for a state or option
// the layout above cannot hold and for a ParamState or Options without
// serialize().
State save_optimizer_state(const torch::optim::Optimizer& optimizer);

// Replaces the optimizer's options and per-parameter state with `state`.
// Everything is checked before anything changes: the optimizer type, the
// number of groups, the number of parameters per group, each buffer's shape
// against its parameter, and (typed codecs) missing or unexpected buffers;
// the message says which group and index (and the parameter's name when
// `groups` is given). Other types are then handed to the optimizer's load():
// if it throws, or leaves a saved parameter without state (a type without
// load()), the parameters' states are put back as they were and the error
// says so.
void load_optimizer_state(torch::optim::Optimizer& optimizer, const State& state,
                          const std::vector<ParamGroupInfo>* groups = nullptr);

// The bytes of the tensors in the optimizer's per-parameter state. The typed
// codecs add up their buffers; any other type is serialised one parameter at
// a time to see its tensors (slow, and an error if its ParamState has no
// serialize()): count again only when the state changed, e.g. its size().
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace lockstep
