// PyTorch's distributed checkpoints (torch.distributed.checkpoint, "DCP"),
// as its FileSystemWriter lays them out: a directory with a `.metadata`
// file (a pickle of DCP's Metadata dataclass: each entry's dtype, size and
// chunks, and where each chunk's bytes lie) and `__<rank>_0.distcp` files
// holding each chunk as a torch.save(tensor) record at its offset. Entries
// that are Python objects (an optimizer's lr, betas, params) are
// torch.save(object) records, DCP's BytesStorageMetadata.
//
//   dcp.save(model.state_dict(), checkpoint_id="ckpt")         # Python, any world size, FSDP2 or not
//   auto weights = lockstep::read_dcp_state_dict("ckpt");       // whole tensors by name, on the CPU
//   lockstep::write_dcp_state_dict(weights, "out");             // dcp.load(model.state_dict(), checkpoint_id="out")
//
//   lockstep::DcpReader reader("ckpt");                          // only the chunks a box overlaps are read
//   torch::Tensor rows = reader.read_box("model.fc.weight", {4, 0}, {3, 13});
//
//   // Every rank its own part, then rank 0 the metadata (dcp.save's plan, without its Python):
//   nlohmann::json records = lockstep::write_dcp_rank_file(dir, rank, part);
//   if (rank == 0) lockstep::write_dcp_metadata(dir, all_gather(records));
//
// Reading assembles each tensor from its chunks, whichever ranks' files hold
// them (a sharded FSDP2/DTensor model, or plain tensors saved by rank 0), so
// the result is the full state dict at any saved world size. Objects are
// read by lockstep's restricted unpickler (torch_pickle.h) as plain values;
// read_dcp_state_dict skips them. The `.metadata` pickle is read the same
// way: nothing in it is executed, and every chunk is checked against its
// tensor's bounds and its file's size.
//
// write_dcp_state_dict makes a single-writer checkpoint, one `__0_0.distcp`
// and the `.metadata`, each tensor one whole chunk, which dcp.load reads at
// any world size into plain tensors or sharded DTensors. It is atomic: the
// files go to a temporary directory beside `dir`, which then takes the place
// of `dir` (an exchange of the two names), so a killed writer leaves an
// earlier checkpoint at `dir` whole. A collective save writes into `dir`
// itself, and `.metadata`, written last, is what makes it a checkpoint, as
// with dcp.save.
#pragma once

#include <ATen/core/ivalue.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include "lockstep/checkpoint/torch_pickle.h"

namespace lockstep {

// Whether `path` is a DCP checkpoint: a directory with a `.metadata` file.
bool is_dcp_checkpoint(const std::string& path);

// Errors name the directory or file and what is wrong: no .metadata, a
// chunk outside its tensor or its file, a dtype lockstep does not know.
std::map<std::string, torch::Tensor> read_dcp_state_dict(const std::string& dir);

// Tensors of any device, dtype (float, int, bool, complex) and layout; they
// are written contiguous, from the CPU.
void write_dcp_state_dict(const std::map<std::string, torch::Tensor>& tensors, const std::string& dir);

// ---- writing a checkpoint from several ranks ---------------------------------

// An entry's place in the nested state dict dcp.save was given: its keys and
// list indices, ["optim", "param_groups", 0, "lr"]; its name is them joined
// with dots ("optim.param_groups.0.lr"), as DCP's flatten_state_dict names it.
using DcpPath = nlohmann::json;
std::string dcp_name(const DcpPath& path);

// A box of a tensor: `values` lies at `offsets` of the whole tensor of `size`.
struct DcpTensorPart {
  DcpPath path;
  std::vector<int64_t> size;
  std::vector<int64_t> offsets;
  torch::Tensor values;
};
// A Python object (a float, a tuple, None, a list of strings), as torch.save writes it.
struct DcpObject {
  DcpPath path;
  c10::IValue value;
};
// What one rank writes. The boxes of a tensor, over all ranks, must tile it.
struct DcpRankPart {
  std::vector<DcpTensorPart> tensors;
  std::vector<DcpObject> objects;
};

// Writes `__<rank>_0.distcp` into `dir` (which must exist) durably, and
// returns what the metadata needs of it: gather every rank's and hand them to
// write_dcp_metadata.
nlohmann::json write_dcp_rank_file(const std::string& dir, int rank, const DcpRankPart& part);
// Writes `dir`/.metadata, atomically, from every rank's records. The error
// names a tensor whose boxes disagree on its size or dtype, overlap, or
// leave part of it uncovered.
void write_dcp_metadata(const std::string& dir, const std::vector<nlohmann::json>& rank_records);

// The flat elements [begin, begin + count) of a row-major tensor of `shape`
// as boxes (few: the rest of a first row, whole rows, the start of a last
// one, recursively), each with where it starts among those elements.
struct DcpBox {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t flat_begin = 0;  // among [begin, begin + count)
};
std::vector<DcpBox> dcp_boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t count);

// ---- reading parts of a checkpoint --------------------------------------------

class DcpReader {
 public:
  // Reads and checks `dir`/.metadata (every tensor's chunks tile it).
  explicit DcpReader(std::string dir);
  ~DcpReader();
  DcpReader(DcpReader&&) noexcept;

  const std::string& dir() const { return dir_; }
  std::vector<std::string> tensor_names() const;
  std::vector<std::string> object_names() const;
  bool has_tensor(const std::string& name) const;
  bool has_object(const std::string& name) const;
  // Of a tensor entry; an error naming the checkpoint when there is none.
  const std::vector<int64_t>& size(const std::string& name) const;
  c10::ScalarType dtype(const std::string& name) const;

  // The whole tensor, and a box of it: only the chunks that overlap it are read.
  torch::Tensor read(const std::string& name) const;
  torch::Tensor read_box(const std::string& name, const std::vector<int64_t>& offsets,
                         const std::vector<int64_t>& sizes) const;
  // An object entry, unpickled as plain values (never instantiated).
  Unpickled read_object(const std::string& name) const;

 private:
  struct Index;
  std::string dir_;
  std::unique_ptr<Index> index_;
};

}  // namespace lockstep
