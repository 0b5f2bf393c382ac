// The CUDA graph seam: record the work a function issues on the current GPU
// once, replay it many times (at::cuda::CUDAGraph, what torch.cuda.graph
// wraps). Only CUDA builds of libtorch can capture; in CPU builds capture()
// says so. engine/cuda_graph_step.h captures a whole training step with it.
//
//   lockstep::compat::run_on_side_stream([&] { step(); });   // warm-up, as PyTorch's docs do it
//   lockstep::compat::CudaGraph graph;
//   graph.capture([&] { step(); });    // records, runs nothing
//   graph.replay();                    // runs what was recorded, on the current stream's order
//
// Every tensor the recorded work reads or writes keeps its address: inputs
// are copied into tensors made before the capture, outputs are read from the
// tensors the capture made. Each graph allocates from its own memory pool.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <c10/macros/Macros.h>

namespace lockstep::compat {

class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  C10_DISABLE_COPY_AND_ASSIGN(CudaGraph);

  // Records what `body` issues on the current CUDA device. It runs on a side
  // stream that waits for the current one (which then waits for it), and
  // allocates from this graph's private pool. When `body` throws, or does
  // what a capture forbids (a host read of a device value, a synchronisation),
  // the capture is abandoned and lockstep::Error says what failed, naming the
  // last operation `body` started (capture_failure_message). Once per graph.
  void capture(const std::function<void()>& body);
  // Runs what was recorded, ordered after the work already on the current stream.
  void replay();
  bool captured() const { return captured_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool captured_ = false;
};

// Runs `body` on a side stream of the current GPU that waits for the current
// stream, and makes the current stream wait for it (PyTorch warms a graph's
// body up this way: lazily made handles and workspaces then belong to the
// stream the capture uses). In CPU builds, runs `body` as it is.
void run_on_side_stream(const std::function<void()>& body);

// Whether the current CUDA stream is being captured into a graph (false in
// CPU builds). Code that writes host values into device tensors before each
// step asks, because a write recorded in a graph would replay the value it
// had at capture.
bool current_stream_capturing();

// What a failed capture reports: `error` is the CUDA or PyTorch error,
// `last_operation` the last operator the captured code started ("" if none
// was seen). Says what a capture forbids and how to find it.
std::string capture_failure_message(const std::string& error, const std::string& last_operation);

// Records the name of the last operator started on this thread while it
// lives (a thread-local RecordFunction callback), so that a failure can be
// pinned on an operation. Works on every device.
class LastOperation {
 public:
  LastOperation();
  ~LastOperation();
  C10_DISABLE_COPY_AND_ASSIGN(LastOperation);
  std::string name() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::compat
