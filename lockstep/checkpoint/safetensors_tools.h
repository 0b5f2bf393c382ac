// safetensors tools behind `lockstep ckpt`: a file's header without its data,
// and a checkpoint's model weights exported as a plain safetensors file that
// Python reads (safetensors.torch.load_file, transformers, timm, numpy by hand).
//
//   nlohmann::json header = lockstep::read_safetensors_header("work_dirs/run/model_final.ckpt");
//   header["model/fc.weight"]["dtype"];            // "F32", as the file spells it
//   lockstep::is_lockstep_checkpoint(header);      // true: its __metadata__ says format "lockstep"
//
//   lockstep::export_weights("work_dirs/run/model_final.ckpt", "model.safetensors",
//                            lockstep::ExportOptions().dtype(torch::kFloat16));
//   lockstep::export_weights("work_dirs/run/model_final.ckpt", "model.pt",
//                            lockstep::ExportOptions().format(lockstep::ExportFormat::kPt));
//
// Both kinds of file are safetensors (see checkpoint_file.h); an export keeps
// only the model's parameters and buffers, under the model's own names, with
// {"format": "pt"} in __metadata__ as the Hugging Face tools expect.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/arg.h>
#include <torch/types.h>

#include "lockstep/checkpoint/checkpoint_file.h"  // IWYU pragma: export (read_safetensors_header)

namespace lockstep {

// Whether a header belongs to a lockstep checkpoint (not a plain safetensors file).
bool is_lockstep_checkpoint(const nlohmann::json& header);

// kSafetensors: a plain safetensors file; kPt: torch.save(state_dict)'s
// format, which Python's torch.load reads (pt_file.h).
enum class ExportFormat { kSafetensors, kPt };

struct ExportOptions {
  // Floating-point tensors are cast to this dtype; integer and bool buffers keep theirs.
  TORCH_ARG(std::optional<c10::ScalarType>, dtype) = std::nullopt;
  TORCH_ARG(ExportFormat, format) = ExportFormat::kSafetensors;
  // The EMAHook's averaged model instead of the trained weights (a lockstep
  // checkpoint of a run with EMAHook; under FSDP it holds the full average).
  TORCH_ARG(bool, ema) = false;
};

// Writes the model weights of `checkpoint` (a lockstep checkpoint, or any
// file read_model_weights accepts) to `out` atomically; returns how many
// tensors it wrote. A safetensors export's metadata records the source file,
// its iteration and the run's config when the checkpoint has them (a .pt
// state dict has no place for them).
size_t export_weights(const std::string& checkpoint, const std::string& out,
                      const ExportOptions& options = ExportOptions());

}  // namespace lockstep
