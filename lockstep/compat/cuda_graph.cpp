#include "lockstep/compat/cuda_graph.h"

#include <ATen/record_function.h>

#include <exception>
#include <map>
#include <mutex>
#include <string>

#include "lockstep/core/error.h"

#ifdef LOCKSTEP_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace lockstep::compat {

namespace {

// The operator LastOperation saw start last on this thread.
thread_local std::string t_last_operation;

std::unique_ptr<at::ObserverContext> remember_operation(const at::RecordFunction& fn) {
  t_last_operation = fn.name();
  return nullptr;
}

}  // namespace

struct LastOperation::State {
  at::CallbackHandle handle = 0;
};

LastOperation::LastOperation() : state_(std::make_unique<State>()) {
  t_last_operation.clear();
  state_->handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&remember_operation));
}

LastOperation::~LastOperation() { at::removeCallback(state_->handle); }

std::string LastOperation::name() const { return t_last_operation; }

std::string capture_failure_message(const std::string& error, const std::string& last_operation) {
  const std::string first_line = error.substr(0, error.find('\n'));
  return str_cat("cuda_graph: the training step could not be captured as a CUDA graph",
                 last_operation.empty() ? std::string() : str_cat(" (the last operation it started: ", last_operation, ")"),
                 ": ", first_line,
                 "\nA captured step may only queue work on the GPU. It must not wait for the GPU or read a device "
                 "value on the host: .item() (aten::_local_scalar_dense), a copy to the CPU, nonzero() or a boolean "
                 "mask (their size depends on the data), a host-side `if` on a tensor, a synchronisation. Move such "
                 "reads out of the model's loss() and train_step (log a tensor instead of a number: lockstep reads "
                 "logged losses after the step), or train without cuda_graph.");
}

#ifdef LOCKSTEP_WITH_CUDA

struct CudaGraph::Impl {
  at::cuda::CUDAGraph graph;
};

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;

namespace {

// The one side stream of the current device that warm-ups and captures
// share (made on first use), so that what the warm-up makes lazily for a
// stream (cuBLAS's workspace) exists before the capture, as PyTorch's
// documentation warms up on the stream it captures on.
c10::cuda::CUDAStream side_stream() {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  const c10::DeviceIndex device = c10::cuda::current_device();
  std::lock_guard<std::mutex> lock(mutex);
  auto found = streams.find(device);
  if (found == streams.end()) found = streams.emplace(device, c10::cuda::getStreamFromPool(false, device)).first;
  return found->second;
}

// `waiter` waits for the work queued on `first` so far.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& first) {
  at::cuda::CUDAEvent ready;
  ready.record(first);
  ready.block(waiter);
}

// A failure that a capture caused (CUDA's and PyTorch's capture errors all
// say "captur...") is explained as one; any other error of the step is
// rethrown as the step's own.
[[noreturn]] void throw_capture_failure(const std::exception_ptr& failure, const std::string& last_operation) {
  const std::string message = describe_exception(failure);
  if (message.find("captur") == std::string::npos) std::rethrow_exception(failure);
  throw Error(capture_failure_message(message, last_operation));
}

}  // namespace

void CudaGraph::capture(const std::function<void()>& body) {
  LOCKSTEP_CHECK(!captured_, "CudaGraph::capture: this graph holds a capture already");
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream side = side_stream();
  wait_for(side, current);
  LastOperation last;
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    std::exception_ptr failure;
    // Autocast's cache of cast weights would keep tensors of the capture's
    // pool from one autocast region to the next; PyTorch's CUDA graph notes
    // ask for it off while capturing (the casts compute the same values).
    const bool cache_was_enabled = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    try {
      // Thread-local mode: the data loader's threads may pin memory while
      // this one captures (global mode would fail them); the autograd
      // engine's threads still record onto the capture stream.
      impl_->graph.capture_begin(/*pool=*/{0, 0}, cudaStreamCaptureModeThreadLocal);
      body();
    } catch (...) {
      failure = std::current_exception();
    }
    at::autocast::set_autocast_cache_enabled(cache_was_enabled);
    if (failure) {
      // The capture is invalid; end it so that the stream leaves capture mode,
      // whatever that reports.
      try {
        impl_->graph.capture_end();
      } catch (const std::exception&) {
      }
      throw_capture_failure(failure, last.name());
    }
    try {
      impl_->graph.capture_end();
    } catch (...) {
      throw_capture_failure(std::current_exception(), last.name());
    }
  }
  wait_for(current, side);
  captured_ = true;
}

void CudaGraph::replay() {
  LOCKSTEP_CHECK(captured_, "CudaGraph::replay: nothing was captured");
  impl_->graph.replay();
}

bool current_stream_capturing() {
  // Without a context on the current device nothing can be capturing (and asking would make one).
  if (c10::cuda::device_count() == 0 || !c10::cuda::hasPrimaryContext(c10::cuda::current_device())) return false;
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

void run_on_side_stream(const std::function<void()>& body) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream side = side_stream();
  wait_for(side, current);
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    body();
  }
  wait_for(current, side);
}

#else  // CPU builds

struct CudaGraph::Impl {};

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;

void CudaGraph::capture(const std::function<void()>& /*body*/) {
  LOCKSTEP_FAIL("cuda_graph: this libtorch was built without CUDA, and only a CUDA build can capture a CUDA graph");
}

void CudaGraph::replay() { LOCKSTEP_FAIL("CudaGraph::replay: nothing was captured"); }

bool current_stream_capturing() { return false; }

void run_on_side_stream(const std::function<void()>& body) { body(); }

#endif

}  // namespace lockstep::compat
