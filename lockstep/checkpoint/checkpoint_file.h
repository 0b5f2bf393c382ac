// Checkpoint files: a State on disk, in the safetensors layout.
//
// The file is an ordinary safetensors file (8-byte little-endian header
// length, a JSON header, then the raw tensor bytes), so any safetensors
// reader -- Python's, Rust's, numpy by hand -- can open it. The header's
// __metadata__ carries lockstep's JSON values and CRC-32 checksums of every
// tensor, of the tensor index and of the values, so a flipped byte anywhere
// is detected on load and named.
//
//   lockstep::write_checkpoint_file("work_dirs/run/model_0000999.ckpt", state);   // atomic
//   lockstep::State loaded = lockstep::read_checkpoint_file("work_dirs/run/model_0000999.ckpt");
//
//   // Parts of it, read when asked (a slice of a tensor reads that slice):
//   lockstep::StateReader file = lockstep::open_checkpoint_file("work_dirs/run/model_0000999.ckpt");
//   torch::Tensor rows = file.part("model").read_elements("fc.weight", 0, 128);
//
//   // Plain weights for other tools (no lockstep metadata, names as given):
//   lockstep::write_safetensors_file("model.safetensors", tensors, {{"format", "pt"}});
//   nlohmann::json header = lockstep::read_safetensors_header("model.safetensors");   // no data read
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include "lockstep/core/state.h"
#include "lockstep/core/state_reader.h"

namespace lockstep {

// The largest header a checkpoint or safetensors file may declare; a larger
// one is corruption, refused before anything is allocated for it.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 256ull << 20;

// Writes atomically (see AtomicFileWriter). Tensors are saved from the CPU, contiguous.
void write_checkpoint_file(const std::string& path, const State& state);
// Reads and verifies every checksum; errors name the file and the fault.
State read_checkpoint_file(const std::string& path);
// Opens a checkpoint and verifies its header and values; tensors are read on
// demand, each read verified by the checksums of the 64 KiB blocks it
// touches (a whole-tensor checksum for smaller tensors and older files).
StateReader open_checkpoint_file(const std::string& path);
// Verifies a checkpoint without keeping it in memory; returns "" if good,
// otherwise the reason it is not.
std::string verify_checkpoint_file(const std::string& path);

void write_safetensors_file(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                            const std::map<std::string, std::string>& metadata = {});
struct SafetensorsContent {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsContent read_safetensors_file(const std::string& path);

// The JSON header of any safetensors file, a checkpoint or plain weights
// (tensor entries and __metadata__), without reading the data: the same
// reader the functions above use, so its errors are theirs. The entries
// themselves are validated when the file is read.
nlohmann::json read_safetensors_header(const std::string& path);

}  // namespace lockstep
