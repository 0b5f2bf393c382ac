#include "lockstep/dist/internal/ring.h"

#include <ATen/core/grad_mode.h>

#include "lockstep/core/error.h"
#include "lockstep/dist/work.h"

namespace lockstep::detail {

namespace {

std::chrono::milliseconds remaining(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// Sends `out` to `next` and receives `in` from `prev` at the same time, so
// that neither side waits for the other to finish first. CUDA tensors go
// through host memory on Gloo (Note [Gloo's send and recv move host memory]).
void exchange(compat::C10dGroup& group, at::Tensor out, int next, at::Tensor in, int prev, int tag,
              Deadline deadline) {
  c10::intrusive_ptr<compat::C10dWork> send_work, recv_work;
  const at::Tensor out_moved = p2p_tensor(group, out);
  const at::Tensor in_moved = p2p_tensor(group, in, /*for_receiving=*/true);
  if (out.numel() > 0) {
    std::vector<at::Tensor> tensors{out_moved};
    send_work = group.send(tensors, next, tag);
  }
  if (in.numel() > 0) {
    std::vector<at::Tensor> tensors{in_moved};
    recv_work = group.recv(tensors, prev, tag);
  }
  if (recv_work && !compat::wait_work(*recv_work, remaining(deadline))) {
    throw StepTimeout(str_cat("receiving from group rank ", prev));
  }
  if (send_work && !compat::wait_work(*send_work, remaining(deadline))) {
    throw StepTimeout(str_cat("sending to group rank ", next));
  }
  if (in.numel() > 0 && !in_moved.is_same(in)) in.copy_(in_moved);
}

int mod(int value, int size) { return ((value % size) + size) % size; }

}  // namespace

// Note [Gloo's send and recv move host memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// c10d's Gloo collectives take CUDA tensors (they copy through host memory
// themselves), but its send and recv hand the tensor's pointer to the socket
// calls as it is. A CUDA tensor's device pointer fails there, and the peer
// sees "Connection closed by peer": the SyncBatchNorm of two ranks sharing a
// GPU over Gloo died this way on an H100 (scripts/gpu-check.sh cuda-paths),
// as lockstep's ring all-gather is made of send and recv. So every
// point-to-point transfer lockstep makes over Gloo moves a CUDA tensor
// through a host copy: sent from a copy, received into a host buffer that is
// copied to the device after. NCCL moves device memory itself.
at::Tensor p2p_tensor(const compat::C10dGroup& group, const at::Tensor& tensor, bool for_receiving) {
  if (!tensor.is_cuda() || compat::is_nccl(group)) return tensor;
  if (for_receiving) return at::empty(tensor.sizes(), tensor.options().device(at::kCPU));
  return tensor.to(at::kCPU).contiguous();
}

int ring_tag(long long seq, int space) {
  constexpr int kTagsPerSpace = kFirstReservedTag / kRingTagSpaces;
  return kFirstReservedTag + space * kTagsPerSpace + static_cast<int>(seq % kTagsPerSpace);
}

void ring_all_gather(compat::C10dGroup& group, int rank, int size, std::vector<at::Tensor>& chunks, int tag,
                     Deadline deadline) {
  const int next = mod(rank + 1, size), prev = mod(rank - 1, size);
  // Step s forwards the piece that arrived in step s-1 (own piece first).
  for (int step = 0; step + 1 < size; ++step) {
    exchange(group, chunks[mod(rank - step, size)], next, chunks[mod(rank - step - 1, size)], prev, tag, deadline);
  }
}

void ring_reduce_scatter(compat::C10dGroup& group, int rank, int size, const at::Tensor& input, at::Tensor& out,
                         RingReduce reduce, int tag, Deadline deadline) {
  const int64_t n = out.numel();
  auto chunk = [&](int index) { return input.narrow(0, index * n, n); };
  auto combine = [&](at::Tensor& target, const at::Tensor& a, const at::Tensor& b) {
    switch (reduce) {
      case RingReduce::kSum: at::add_out(target, a, b); break;
      case RingReduce::kMax: at::maximum_out(target, a, b); break;
      case RingReduce::kMin: at::minimum_out(target, a, b); break;
    }
  };
  if (size == 1) {
    out.copy_(chunk(0));
    return;
  }
  const int next = mod(rank + 1, size), prev = mod(rank - 1, size);
  // Step s sends the partial sum of chunk rank-s-1 and receives that of chunk
  // rank-s-2 from prev, adding its own contribution; after N-1 steps the
  // chunk received is this rank's own, complete.
  at::Tensor received = at::empty_like(out);
  at::Tensor partial;  // what the next step sends
  for (int step = 0; step + 1 < size; ++step) {
    at::Tensor outgoing = step == 0 ? chunk(mod(rank - 1, size)) : partial;
    exchange(group, outgoing, next, received, prev, tag, deadline);
    const int arrived = mod(rank - step - 2, size);
    if (step + 2 == size) {
      combine(out, chunk(arrived), received);
    } else {
      if (!partial.defined()) partial = at::empty_like(out);
      combine(partial, chunk(arrived), received);
    }
  }
}

SerialExecutor::SerialExecutor() : thread_([this] { loop(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_future<void> SerialExecutor::submit(std::function<void()> task) {
  std::packaged_task<void()> packaged(std::move(task));
  auto future = packaged.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(packaged));
  }
  cv_.notify_one();
  return future;
}

void SerialExecutor::loop() {
  // Collectives move data and record no graph. Grad mode is per thread and on
  // by default, so without this a tensor that carries history (a statistic of
  // a layer's input) would make the ring's in-place copies autograd's concern.
  at::NoGradGuard no_grad;
  while (true) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace lockstep::detail
