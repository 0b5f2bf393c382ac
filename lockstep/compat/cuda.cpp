// Everything CUDA-specific about the device runtime is in this file: the rest
// of lockstep builds and behaves the same with or without it.
#include "lockstep/compat/cuda.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <atomic>
#include <string>
#include <thread>

#include "lockstep/core/error.h"

#ifdef LOCKSTEP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
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

// Note [Counting host synchronisations]
// A training step that waits for the GPU more than it must loses the overlap
// of host and device work; lockstep's goal is at most one wait per step (the
// loss a logger reads). PyTorch can say when it waits: in sync debug mode
// "warn" (torch.cuda.set_sync_debug_mode) every implicit synchronisation -
// a copy to the host, .item(), nonzero, a stream synchronize - raises the
// warning "called a synchronizing CUDA operation". CudaSyncCounter turns that
// mode on and installs a warning handler, which is per thread in c10, that
// counts those warnings and passes every other one on. lockstep's explicit
// waits (synchronize_cuda) count once each, whatever CUDA reports inside
// them. The mode is process-wide; the previous mode and handler come back
// when the counter ends.
struct CudaSyncCounter::State
#ifdef LOCKSTEP_WITH_CUDA
    : c10::WarningHandler
#endif
{
  std::atomic<int64_t> count{0};
  bool counting = false;
#ifdef LOCKSTEP_WITH_CUDA
  c10::WarningHandler* previous_handler = nullptr;
  c10::cuda::SyncDebugMode previous_mode = c10::cuda::SyncDebugMode::L_DISABLED;

  static bool is_sync(const std::string& message) {
    return message.find("called a synchronizing CUDA operation") != std::string::npos;
  }
#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning& warning) override {
    if (!is_sync(warning.msg())) return previous_handler->process(warning);
    if (!inside_explicit_sync) ++count;
  }
#else
  void process(const c10::SourceLocation& location, const std::string& message, bool verbatim) override {
    if (!is_sync(message)) return previous_handler->process(location, message, verbatim);
    if (!inside_explicit_sync) ++count;
  }
#endif
#endif
  bool inside_explicit_sync = false;
  std::thread::id thread = std::this_thread::get_id();  // the thread whose waits count
};

namespace {
// The live counter, if any (one at a time).
std::atomic<CudaSyncCounter::State*> active_counter{nullptr};
}  // namespace

CudaSyncCounter::CudaSyncCounter() : state_(std::make_unique<State>()) {
#ifdef LOCKSTEP_WITH_CUDA
  if (cuda_device_count() == 0) return;
  CudaSyncCounter::State* none = nullptr;
  LOCKSTEP_CHECK(active_counter.compare_exchange_strong(none, state_.get()),
                 "a CudaSyncCounter is already counting: one at a time");
  state_->counting = true;
  state_->previous_mode = c10::cuda::warning_state().get_sync_debug_mode();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  state_->previous_handler = c10::WarningUtils::get_warning_handler();
  c10::WarningUtils::set_warning_handler(state_.get());
#endif
}

CudaSyncCounter::~CudaSyncCounter() {
#ifdef LOCKSTEP_WITH_CUDA
  if (!state_->counting) return;
  c10::WarningUtils::set_warning_handler(state_->previous_handler);
  c10::cuda::warning_state().set_sync_debug_mode(state_->previous_mode);
  active_counter.store(nullptr);
#endif
}

bool CudaSyncCounter::counting() const { return state_->counting; }
int64_t CudaSyncCounter::count() const { return state_->count.load(); }
void CudaSyncCounter::reset() { state_->count.store(0); }

void synchronize_cuda(int device) {
  if (device < 0 || device >= cuda_device_count()) return;
  CudaSyncCounter::State* counter = active_counter.load();
  if (counter == nullptr || counter->thread != std::this_thread::get_id()) return torch::cuda::synchronize(device);
  ++counter->count;
  counter->inside_explicit_sync = true;
  try {
    torch::cuda::synchronize(device);
  } catch (...) {
    counter->inside_explicit_sync = false;
    throw;
  }
  counter->inside_explicit_sync = false;
}

}  // namespace lockstep::compat
