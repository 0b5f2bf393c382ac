#include "lockstep/comm/internal/ring.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "lockstep/core/error.h"
#include "lockstep/comm/work.h"

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

// Note [Doubling rounds for small gathers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A ring all-gather is N - 1 steps, and each waits for the previous rank to
// finish its own: its time is N - 1 wake-ups of a process, whatever the
// size. A small gather (the world's host names when it is set up, metrics,
// evaluation results, shapes before an uneven gather) is nothing but those
// waits. At 128 ranks on 2 cores each wake-up took 12-14 ms (every process's
// Gloo loop thread polls 100 times a second, so 100 or so threads are always
// runnable), and setting up the world group's node groups, one gather of
// host names, took 3.2-3.8 s (BENCHMARKS.md, "bench/scaling").
//
// Bruck's all-gather takes ceil(log2 N) rounds: in round k (distance
// d = 2^k) each rank sends the pieces of ranks rank .. rank+c-1, which it
// holds since the rounds before, to rank - d, and receives those of ranks
// rank+d .. rank+d+c-1 from rank + d, c = min(d, N - d). Every rank still
// receives each other rank's piece once, (N-1)/N of the total, as in the
// ring; the price is packing each round's pieces into one message and
// unpacking them (two copies of what moves). So the doubling rounds serve
// totals up to kDoublingMaxBytes, where the waits dominate, and the ring
// everything larger (FSDP's parameter gathers), where copies would. On 2 and 3
// ranks both take the same number of steps and the ring, without copies, is
// used. Each rank sends to distinct peers in distinct rounds (2^k < N are
// distinct mod N), so one tag serves every round.
void doubling_all_gather(compat::C10dGroup& group, int rank, int size, std::vector<at::Tensor>& chunks, int tag,
                         Deadline deadline) {
  for (int distance = 1; distance < size; distance *= 2) {
    const int count = std::min(distance, size - distance);
    std::vector<at::Tensor> outgoing, incoming;
    int64_t incoming_numel = 0;
    for (int j = 0; j < count; ++j) {
      outgoing.push_back(chunks[static_cast<size_t>(mod(rank + j, size))]);
      incoming.push_back(chunks[static_cast<size_t>(mod(rank + distance + j, size))]);
      incoming_numel += incoming.back().numel();
    }
    const at::Tensor packed = count == 1 ? outgoing[0] : at::cat(outgoing);
    at::Tensor arriving = count == 1 ? incoming[0] : at::empty({incoming_numel}, chunks[0].options());
    exchange(group, packed, mod(rank - distance, size), arriving, mod(rank + distance, size), tag, deadline);
    if (count == 1) continue;
    int64_t offset = 0;
    for (auto& piece : incoming) {
      piece.copy_(arriving.narrow(0, offset, piece.numel()));
      offset += piece.numel();
    }
  }
}

void all_gather_pieces(compat::C10dGroup& group, int rank, int size, std::vector<at::Tensor>& chunks, int tag,
                       Deadline deadline, bool ring_only) {
  int64_t total_bytes = 0;
  for (const auto& chunk : chunks) total_bytes += chunk.numel() * static_cast<int64_t>(chunk.element_size());
  if (!ring_only && size > 3 && total_bytes <= kDoublingMaxBytes) {
    doubling_all_gather(group, rank, size, chunks, tag, deadline);
  } else {
    ring_all_gather(group, rank, size, chunks, tag, deadline);
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
