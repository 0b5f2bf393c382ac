#include "lockstep/compat/internal/storage.h"

#include <c10/core/StorageImpl.h>

#include "lockstep/core/error.h"

namespace lockstep::compat {

void free_storage(const torch::Tensor& tensor) {
  LOCKSTEP_CHECK(tensor.defined() && tensor.has_storage(), "free_storage needs a tensor with storage");
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) return;
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

void allocate_storage(const torch::Tensor& tensor) {
  LOCKSTEP_CHECK(tensor.defined() && tensor.has_storage(), "allocate_storage needs a tensor with storage");
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(tensor.storage_offset() + tensor.numel()) * tensor.element_size();
  const c10::StorageImpl& current = *storage;
  if (current.nbytes() == bytes && current.data_ptr().get() != nullptr) return;
  LOCKSTEP_CHECK(storage->allocator() != nullptr, "allocate_storage: the storage has no allocator");
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

size_t storage_bytes(const torch::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return 0;
  return tensor.storage().nbytes();
}

bool same_storage(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.has_storage() && b.has_storage() &&
         a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

}  // namespace lockstep::compat
