// IDX files: the format of MNIST, Fashion-MNIST and their relatives.
//
// An IDX file is a big-endian header (magic 0x0000TTNN: element type TT,
// NN dimensions, then NN 32-bit sizes) followed by the elements. The files
// usually ship gzipped; both forms are read (zlib reads plain files as-is).
//
//   torch::Tensor labels = lockstep::read_idx_file(root + "/train-labels-idx1-ubyte.gz",
//                                                  lockstep::kIdxLabelsMagic);   // uint8 [60000]
//   torch::Tensor images = lockstep::read_idx_file(root + "/train-images-idx3-ubyte.gz",
//                                                  lockstep::kIdxImagesMagic);   // uint8 [60000, 28, 28]
//
// A damaged download is the usual fault, so the payload must match the header
// exactly: a short file or extra bytes at the end are errors, and every error
// names the file and what is wrong with it, e.g.
//   "train-images-idx3-ubyte.gz: truncated: header says 60000x28x28 = 47040000 bytes, file holds 1234"
#pragma once

#include <cstdint>
#include <string>

#include <torch/types.h>

namespace lockstep {

// Unsigned bytes, one dimension (labels) and three dimensions (images).
constexpr uint32_t kIdxLabelsMagic = 0x00000801;
constexpr uint32_t kIdxImagesMagic = 0x00000803;

// Reads an IDX file of unsigned bytes (gzipped or raw) into a uint8 tensor
// shaped like the header. `expected_magic` (0 = any unsigned-byte magic)
// rejects a file of the wrong kind, such as labels passed for images.
torch::Tensor read_idx_file(const std::string& path, uint32_t expected_magic = 0);

}  // namespace lockstep
