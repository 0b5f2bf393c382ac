// Everything CUDA-specific about the device runtime is in this file: the rest
// of lockstep builds and behaves the same with or without it.
#include "lockstep/compat/cuda.h"

#include <torch/cuda.h>

#include "lockstep/core/error.h"

#ifdef LOCKSTEP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace lockstep::compat {

bool built_with_cuda() {
#ifdef LOCKSTEP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

void set_current_cuda_device(int index) {
#ifdef LOCKSTEP_WITH_CUDA
  const int count = cuda_device_count();
  LOCKSTEP_CHECK(index >= 0 && index < count, "cannot use GPU ", index, ": this process sees ", count,
                 " GPU(s) (check CUDA_VISIBLE_DEVICES)");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#else
  LOCKSTEP_FAIL("cannot use GPU ", index, ": this lockstep was built against a libtorch without CUDA");
#endif
}

int current_cuda_device() {
#ifdef LOCKSTEP_WITH_CUDA
  return cuda_device_count() > 0 ? static_cast<int>(c10::cuda::current_device()) : -1;
#else
  return -1;
#endif
}

CudaDeviceIdentity cuda_device_identity(int index) {
#ifdef LOCKSTEP_WITH_CUDA
  const int count = cuda_device_count();
  LOCKSTEP_CHECK(index >= 0 && index < count, "no GPU ", index, ": this process sees ", count, " GPU(s)");
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  // nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
  std::string uuid = "GPU-";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    const auto byte = static_cast<unsigned char>(properties->uuid.bytes[i]);
    uuid += hex[byte >> 4];
    uuid += hex[byte & 0xf];
  }
  return {uuid, properties->name};
#else
  LOCKSTEP_FAIL("cannot identify GPU ", index, ": this lockstep was built against a libtorch without CUDA");
#endif
}

bool can_pin_memory() { return built_with_cuda() && cuda_device_count() > 0; }

std::optional<CudaMemoryStats> cuda_memory_stats(int device) {
#ifdef LOCKSTEP_WITH_CUDA
  if (device < 0 || device >= cuda_device_count()) return std::nullopt;
  // Index 0 of each counter array is StatType::AGGREGATE (all pool kinds);
  // the enum moved namespaces between libtorch versions, its value did not.
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  CudaMemoryStats out;
  out.allocated = stats.allocated_bytes[0].current;
  out.peak_allocated = stats.allocated_bytes[0].peak;
  out.reserved = stats.reserved_bytes[0].current;
  out.peak_reserved = stats.reserved_bytes[0].peak;
  return out;
#else
  (void)device;
  return std::nullopt;
#endif
}

void empty_cuda_cache() {
#ifdef LOCKSTEP_WITH_CUDA
  if (cuda_device_count() > 0) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

void reset_cuda_peak_memory(int device) {
#ifdef LOCKSTEP_WITH_CUDA
  if (device >= 0 && device < cuda_device_count()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  }
#else
  (void)device;
#endif
}

void synchronize_cuda(int device) {
  if (device >= 0 && device < cuda_device_count()) torch::cuda::synchronize(device);
}

}  // namespace lockstep::compat
