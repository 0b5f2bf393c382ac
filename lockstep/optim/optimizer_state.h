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
//
// Supported: SGD, Adam, AdamW, RMSprop. Layout of the State:
//   tensors  "0.3.momentum_buffer" (SGD), "0.3.exp_avg", "0.3.exp_avg_sq",
//            "0.3.max_exp_avg_sq" (Adam/AdamW with amsgrad), "0.3.square_avg",
//            "0.3.momentum_buffer", "0.3.grad_avg" (RMSprop)
//   values   {"type": "Adam",
//             "groups": [{"num_params": 4, "options": {"lr": ..., "betas": [b1, b2], ...}}, ...],
//             "params": {"0.3": {"step": 12}, ...}}   // one entry per parameter that has state
//
// The saved tensors alias the optimizer's live buffers (no copy, as PyTorch's
// state_dict does): serialise them before the next optimizer step. Loading
// copies them onto each parameter's device and dtype, so the loaded optimizer
// never shares memory with the State.
#pragma once

#include <vector>

#include <torch/optim/optimizer.h>

#include "lockstep/core/state.h"
#include "lockstep/optim/param_groups.h"

namespace lockstep {

State save_optimizer_state(const torch::optim::Optimizer& optimizer);

// Replaces the optimizer's options and per-parameter state with `state`.
// Everything is checked before anything changes: the optimizer type, the
// number of groups, the number of parameters per group, each buffer's shape
// against its parameter, and missing or unexpected buffers; the message says
// which group and index (and the parameter's name when `groups` is given).
void load_optimizer_state(torch::optim::Optimizer& optimizer, const State& state,
                          const std::vector<ParamGroupInfo>* groups = nullptr);

}  // namespace lockstep
