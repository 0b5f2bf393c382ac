// What lockstep's reader and writer of PyTorch's distributed checkpoints
// (dcp_checkpoint.h; dcp_checkpoint.cpp reads, dcp_writer.cpp writes) share:
// DCP's module names, its dtype names, a tensor's chunks and their checks.
//
//   for (const auto& [type, name] : lockstep::dcp_format::dtype_names()) ...   // c10::kFloat, "float32"
//   lockstep::dcp_format::check_chunks(entry, "model.w", ".metadata");         // tile the tensor, or an error
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

namespace lockstep::dcp_format {

inline constexpr char kMetadataModule[] = "torch.distributed.checkpoint.metadata";
inline constexpr char kFilesystemModule[] = "torch.distributed.checkpoint.filesystem";
inline constexpr char kDcpVersion[] = "1.0.0";  // filesystem.py's CURRENT_DCP_VERSION in PyTorch 2.14

// torch.<name> of each dtype DCP's TensorProperties may hold.
const std::vector<std::pair<c10::ScalarType, std::string>>& dtype_names();

// One chunk (box) of a tensor, and a tensor with its chunks.
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};
struct TensorEntry {
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;
};

int64_t volume(const std::vector<int64_t>& sizes);
std::string dims_text(const std::vector<int64_t>& dims);
// Each chunk lies inside its tensor, no two overlap and together they cover
// it; otherwise an error naming `source` and the tensor.
void check_chunks(const TensorEntry& entry, const std::string& name, const std::string& source);
// `dir` without trailing slashes, so that its parent is where it lies.
std::filesystem::path directory_path(const std::string& dir);

}  // namespace lockstep::dcp_format
