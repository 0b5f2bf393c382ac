// PyTorch weight files (.pt, .pth): the zip archives torch.save writes.
//
//   torch.save(model.state_dict(), "resnet18.pt")                # Python
//   auto weights = lockstep::read_pt_state_dict("resnet18.pt");   // name -> tensor, on the CPU
//   lockstep::write_pt_state_dict(weights, "out.pt");             // torch.load("out.pt") reads it
//
// Reading goes through lockstep's own restricted unpickler (torch_pickle.h):
// nothing in the file is executed, and a file that holds something else (a
// pickled module, a TorchScript archive, the pre-1.6 format, a truncated zip)
// is an error naming the file and what it holds. The state dict may be the
// file itself or nested under "state_dict", "model", "model_state_dict" or
// "module" (mmengine, detectron2, Lightning checkpoints).
#pragma once

#include <map>
#include <string>

#include <ATen/core/ivalue.h>
#include <torch/types.h>

namespace lockstep {

// Whether `path` starts like a zip archive (torch.save's format since 1.6).
bool is_torch_save_file(const std::string& path);

std::map<std::string, torch::Tensor> read_pt_state_dict(const std::string& path);
// The same from the file's bytes; `source` names it in errors (fuzzing, tests).
std::map<std::string, torch::Tensor> read_pt_state_dict_from_bytes(const std::string& bytes, const std::string& source);

// Writes `weights` as torch.save(state_dict) would, atomically: Python's
// torch.load returns a dict of the same names and values.
void write_pt_state_dict(const std::map<std::string, torch::Tensor>& weights, const std::string& path);

// One tensor as torch.save(tensor) writes it, and back: the records of a
// torch.distributed.checkpoint file (dcp_checkpoint.h). Reading, the file
// must hold a tensor (an error naming `source` otherwise).
std::string pt_tensor_bytes(const torch::Tensor& tensor);
torch::Tensor read_pt_tensor_from_bytes(const std::string& bytes, const std::string& source);
// A Python object as torch.save(object) writes it: None, bool, int, float,
// str, and tuples and lists of them (an optimizer's param_group entries in a
// DCP checkpoint); torch.load(weights_only=True) reads it.
std::string pt_object_bytes(const c10::IValue& value);

}  // namespace lockstep
