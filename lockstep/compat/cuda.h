// The CUDA runtime seam: the few device-management calls lockstep makes
// beyond the tensor API. They exist only in CUDA builds of libtorch
// (LOCKSTEP_WITH_CUDA); in CPU builds each one says so, or reports "nothing".
//
//   int gpus = lockstep::compat::cuda_device_count();     // 0 without CUDA
//   lockstep::compat::set_current_cuda_device(local_rank);  // before NCCL or any allocation
//   if (lockstep::compat::can_pin_memory()) batch = batch.pin_memory();
//   auto stats = lockstep::compat::cuda_memory_stats(0);    // caching allocator peaks
//   lockstep::compat::CudaSyncCounter syncs;                // host synchronisations from here on
//   ...; int64_t n = syncs.count();
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace lockstep::compat {

// Whether this libtorch was built with CUDA (decided at compile time).
bool built_with_cuda();

// GPUs this process can see (0 in CPU builds or without a driver/device).
int cuda_device_count();

// Makes `index` this thread's current CUDA device (c10::cuda::set_device):
// NCCL communicators, streams and "cuda" allocations without an index land
// there. Throws lockstep::Error in CPU builds or when `index` is out of range.
void set_current_cuda_device(int index);

// The current CUDA device, or -1 without CUDA.
int current_cuda_device();

// GPU `index`'s UUID as nvidia-smi prints it ("GPU-1490...-...") and its name
// ("NVIDIA H100 80GB HBM3"): the same GPU has the same UUID in every process,
// whatever CUDA_VISIBLE_DEVICES numbers it. Throws lockstep::Error without CUDA.
struct CudaDeviceIdentity {
  std::string uuid;
  std::string name;
};
CudaDeviceIdentity cuda_device_identity(int index);

// Whether page-locked host memory can be allocated: a CUDA build with a
// visible device. Pinned memory makes host-to-device copies asynchronous.
bool can_pin_memory();

// The CUDA caching allocator's counters for one device, in bytes.
struct CudaMemoryStats {
  int64_t allocated = 0;       // in tensors now
  int64_t peak_allocated = 0;  // most ever in tensors, since the last reset
  int64_t reserved = 0;        // held by the allocator now (tensors + cache)
  int64_t peak_reserved = 0;
};

// nullopt without CUDA or when `device` is not a visible GPU.
std::optional<CudaMemoryStats> cuda_memory_stats(int device);
// Starts the peaks again from the current values.
void reset_cuda_peak_memory(int device);

// Returns the caching allocator's unused cached blocks to the driver
// (torch.cuda.empty_cache()); nothing without CUDA.
void empty_cuda_cache();

// Waits for everything queued on `device` (benchmarks time device work).
// Counted by a CudaSyncCounter on this thread as one synchronisation.
void synchronize_cuda(int device);

// Counts the times this thread waits for the GPU while the counter lives
// (Note [Counting host synchronisations] in cuda.cpp): PyTorch's implicit
// ones (.item(), a copy to the host, nonzero, ...) through its sync debug
// mode, and lockstep's own synchronize_cuda. Without CUDA there is nothing to
// count: counting() is false and count() 0. One counter at a time.
class CudaSyncCounter {
 public:
  CudaSyncCounter();  // not copyable: it owns its State
  ~CudaSyncCounter();
  bool counting() const;
  int64_t count() const;  // since construction or the last reset()
  void reset();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::compat
