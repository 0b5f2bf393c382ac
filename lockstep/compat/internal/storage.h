// The storage seam: freeing and re-allocating a tensor's memory in place,
// keeping the Storage object (and so every view of it) alive.
//
// FSDP frees a unit's gathered parameters between uses. Autograd may have
// saved views of them (a Linear saves weight.t()), and those views must see
// the parameters again when backward re-gathers them: so the bytes are
// released and re-allocated *inside* the same StorageImpl, as PyTorch's FSDP
// does with `storage.resize_(0)`. StorageImpl's API is a libtorch internal,
// hence this file.
//
//   torch::Tensor full = torch::empty({1024});
//   auto view = full.narrow(0, 0, 16);
//   lockstep::compat::free_storage(full);          // view.storage().nbytes() == 0
//   lockstep::compat::allocate_storage(full);      // 1024 floats again, same Storage
//
// Reading a tensor whose storage is freed is undefined (kernels do not all
// check): callers must make sure nothing does.
#pragma once

#include <cstddef>

#include <torch/types.h>

namespace lockstep::compat {

// Releases the bytes of `tensor`'s storage (every view of it sees 0 bytes).
void free_storage(const torch::Tensor& tensor);
// (Re)allocates `tensor`'s storage to hold tensor.storage_offset() + numel()
// elements of its dtype with the storage's own allocator; contents are
// undefined. No-op when it already holds that many bytes.
void allocate_storage(const torch::Tensor& tensor);
// Bytes the storage holds now (0 once freed).
size_t storage_bytes(const torch::Tensor& tensor);
// Whether two tensors share one Storage object.
bool same_storage(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace lockstep::compat
