// How the EMAHook's average is named in a checkpoint's trainer state, for
// the three places that read or write it: the hook (hooks/ema_hook.cpp),
// FSDP's sharded form (strategy/fsdp_weight_averaging.cpp) and the export of
// the averaged model (checkpoint/safetensors_tools.cpp, `lockstep ckpt export --ema`).
//
//   state.tensors[std::string(ema_keys::kParameter) + "fc1.weight"] = average;   // one process, DDP
//   state.tensors[std::string(ema_keys::kGathered) + "fc1.weight"] = full;       // FSDP, gathered
#pragma once

namespace lockstep::ema_keys {

inline constexpr const char* kParameter = "param/";  // a parameter's average, by the model's name
inline constexpr const char* kBuffer = "buffer/";    // a buffer's average (update_buffers) or copy
inline constexpr const char* kGathered = "full/";    // FSDP: the gathered full average of any of them

}  // namespace lockstep::ema_keys
