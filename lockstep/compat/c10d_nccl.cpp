// NCCL lives in its own file: its headers exist only in CUDA builds of
// libtorch, and the rest of the compat layer must build without them.
#include "lockstep/compat/c10d.h"

#include "lockstep/core/error.h"

#if defined(LOCKSTEP_WITH_CUDA) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define LOCKSTEP_COMPAT_NCCL 1
#else
#define LOCKSTEP_COMPAT_NCCL 0
#endif

namespace lockstep::compat {

bool has_nccl() { return LOCKSTEP_COMPAT_NCCL != 0; }

c10::intrusive_ptr<C10dGroup> make_nccl(const c10::intrusive_ptr<C10dStore>& store, int rank, int size,
                                        std::chrono::milliseconds timeout) {
#if LOCKSTEP_COMPAT_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store;
  (void)rank;
  (void)size;
  (void)timeout;
  LOCKSTEP_FAIL("backend 'nccl' is not available: this libtorch (", torch_version(),
                ") was built without CUDA/NCCL; use backend 'gloo'");
#endif
}

}  // namespace lockstep::compat
