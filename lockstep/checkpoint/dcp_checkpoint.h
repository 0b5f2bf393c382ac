// PyTorch's distributed checkpoints (torch.distributed.checkpoint, "DCP"),
// as its FileSystemWriter lays them out: a directory with a `.metadata`
// file (a pickle of DCP's Metadata dataclass: each tensor's dtype, size and
// chunks, and where each chunk's bytes lie) and `__<rank>_<n>.distcp` files
// holding each chunk as a torch.save(tensor) record at its offset.
//
//   dcp.save(model.state_dict(), checkpoint_id="ckpt")         # Python, any world size, FSDP2 or not
//   auto weights = lockstep::read_dcp_state_dict("ckpt");       // whole tensors by name, on the CPU
//   lockstep::write_dcp_state_dict(weights, "out");             // dcp.load(model.state_dict(), checkpoint_id="out")
//
// Reading assembles each tensor from its chunks, whichever ranks' files hold
// them (a sharded FSDP2/DTensor model, or plain tensors saved by rank 0), so
// the result is the full state dict at any saved world size. Non-tensor
// entries (DCP's BytesStorageMetadata: ints, strings, pickled objects in the
// state dict) are skipped: they are Python objects, which lockstep never
// unpickles. The `.metadata` pickle is read by lockstep's restricted
// unpickler (torch_pickle.h): nothing in it is executed, and every chunk is
// checked against its tensor's bounds and its file's size.
//
// Writing makes a single-writer checkpoint, one `__0_0.distcp` and the
// `.metadata`, each tensor one whole chunk, which dcp.load reads at any world
// size into plain tensors or sharded DTensors. It is atomic: the files go to
// a temporary directory beside `dir`, which then takes the place of `dir`
// (an exchange of the two names), so a killed writer leaves an earlier
// checkpoint at `dir` whole.
#pragma once

#include <map>
#include <string>

#include <torch/types.h>

namespace lockstep {

// Whether `path` is a DCP checkpoint: a directory with a `.metadata` file.
bool is_dcp_checkpoint(const std::string& path);

// Errors name the directory or file and what is wrong: no .metadata, a
// chunk outside its tensor or its file, a dtype lockstep does not know.
std::map<std::string, torch::Tensor> read_dcp_state_dict(const std::string& dir);

// Tensors of any device, dtype (float, int, bool, complex) and layout; they
// are written contiguous, from the CPU.
void write_dcp_state_dict(const std::map<std::string, torch::Tensor>& tensors, const std::string& dir);

}  // namespace lockstep
