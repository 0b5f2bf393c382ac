// Ring collectives over point-to-point send/recv, for backends that lack the
// native op (Gloo in libtorch 1.13 has neither reduce_scatter nor
// _allgather_base). In a ring of N ranks every rank sends and receives
// (N-1)/N of the data once, which is the bandwidth lower bound; an all_reduce
// followed by a slice moves twice that. Small all-gathers take doubling
// rounds instead: the same bytes in log2(N) waits rather than N - 1.
//
// Internal to lockstep/comm; ProcessGroup is the public face.
//
//   detail::ring_all_gather(*gloo, rank, size, chunks, tag, deadline);
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "lockstep/compat/c10d.h"

namespace lockstep::detail {

using Deadline = std::chrono::steady_clock::time_point;

// c10d's reduction for the elementwise part of a ring step.
enum class RingReduce { kSum, kMax, kMin };

// `chunks[r]` is a contiguous tensor for rank r's piece; on entry this rank's
// own piece is filled, on return every piece is. Pieces may differ in size
// (every rank must pass the same sizes).
void ring_all_gather(compat::C10dGroup& group, int rank, int size, std::vector<at::Tensor>& chunks, int tag,
                     Deadline deadline);

// The same result in ceil(log2 N) rounds instead of N - 1 steps (Bruck's
// all-gather, Note [Doubling rounds for small gathers] in ring.cpp): in round
// k each rank sends what it holds to rank - 2^k, packed into one message.
void doubling_all_gather(compat::C10dGroup& group, int rank, int size, std::vector<at::Tensor>& chunks, int tag,
                         Deadline deadline);

// ring_all_gather or doubling_all_gather, whichever is faster for these
// pieces: the doubling rounds for small totals on 4 ranks or more
// (kDoublingMaxBytes), the ring otherwise; the ring only, with `ring_only`.
constexpr int64_t kDoublingMaxBytes = 1 << 20;
void all_gather_pieces(compat::C10dGroup& group, int rank, int size, std::vector<at::Tensor>& chunks, int tag,
                       Deadline deadline, bool ring_only);

// `input` holds size() equal contiguous chunks of out.numel() elements; on
// return `out` holds the reduction over ranks of chunk `rank`.
void ring_reduce_scatter(compat::C10dGroup& group, int rank, int size, const at::Tensor& input, at::Tensor& out,
                         RingReduce reduce, int tag, Deadline deadline);

// The tag a ring collective with sequence number `seq` uses, in share
// `space` of [2^30, 2^31): each group over one set of connections has its
// own share (Note [One mesh per process]), 2^22 tags long, reused in turn.
// User tags stay below kFirstReservedTag.
constexpr int kFirstReservedTag = 1 << 30;
constexpr int kRingTagSpaces = 256;
int ring_tag(long long seq, int space);

// The tensor to hand `group`'s send (or, `for_receiving`, recv): `tensor`
// itself, except a CUDA tensor on a backend other than NCCL, which moves
// through host memory (Note [Gloo's send and recv move host memory]): a host
// copy to send, or a host buffer to receive into and copy to `tensor` after.
at::Tensor p2p_tensor(const compat::C10dGroup& group, const at::Tensor& tensor, bool for_receiving = false);

// One background thread that runs a group's asynchronous ring collectives in
// issue order.
class SerialExecutor {
 public:
  SerialExecutor();
  ~SerialExecutor();
  std::shared_future<void> submit(std::function<void()> task);

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace lockstep::detail
