// lockstep::ProcessGroup: a small facade over c10d for the collectives that
// data-parallel and sharded training need, with the same behaviour on
// libtorch 1.13 and 2.x.
//
// CPU tensors go through Gloo; CUDA tensors through NCCL when the group was
// created with backend "nccl" (and libtorch has it). What the facade adds:
//   - ReduceOp::kAvg everywhere (sum, then divide; rejected for integers);
//   - bfloat16 (and int16, bool) on Gloo, which lacks them (moved as raw
//     bytes; reduced in float32 / int32 and converted back);
//   - reduce_scatter_tensor and all_gather_into_tensor on Gloo 1.13, which has
//     neither, as bandwidth-optimal rings over send/recv (each rank moves
//     (N-1)/N of the data, half of what all_reduce-then-slice moves);
//   - all_gather of tensors whose sizes differ between ranks;
//   - a hierarchical all_reduce for groups that span several nodes (reduce
//     within each node, all_reduce among the nodes' first ranks across the
//     network, broadcast within each node), switched on per group;
//   - a timeout on every wait, with an error naming the op, group and the
//     ranks that did not show up (see work.h).
//
// Every rank of a group issues the same collectives in the same order.
//
//   auto world = lockstep::world();
//   torch::Tensor t = torch::full({4}, world->rank() + 1.0);
//   world->all_reduce(t, lockstep::ReduceOp::kAvg);           // sync
//   auto work = world->all_reduce(t, lockstep::ReduceOp::kSum, /*async=*/true);
//   work->wait();
//   auto pair = world->new_group({0, 1});                       // nullptr on ranks 2, 3
//   auto ddp = world->view("world.ddp0");          // world's connections, world's order
//   auto metrics = world->side_channel("metrics");  // world's connections, any thread
//   world->enable_hierarchical_all_reduce({0, 0, 1, 1});       // ranks 0,1 on one node, 2,3 on another
//   world->set_algorithms({CollectiveAlgorithm::kRing, CollectiveAlgorithm::kAuto});  // for benchmarks
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>

#include "lockstep/compat/c10d.h"
#include "lockstep/comm/work.h"

namespace lockstep {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

// How reduce_scatter_tensor / all_gather_into_tensor (and all_gather) move
// data. kAuto picks NCCL's native ops, and on Gloo the ring (faster there
// than Gloo's own ops, see collective_algorithm), or for a small all-gather on 4
// ranks or more log2(N) doubling rounds (Note [Doubling rounds for small
// gathers]). kRing forces the ring. The others exist for benchmarks and tests.
enum class CollectiveAlgorithm { kAuto, kNative, kRing, kAllReduce };
struct CollectiveAlgorithms {
  CollectiveAlgorithm reduce_scatter = CollectiveAlgorithm::kAuto;
  CollectiveAlgorithm all_gather = CollectiveAlgorithm::kAuto;
};

namespace detail {
class SerialExecutor;
struct NodeHierarchy;
}

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // What a group is made of; built by init_process_group() and new_group().
  struct Parts {
    std::string name;
    int rank = 0;                                   // in this group
    std::vector<int> global_ranks;                  // world rank of each member
    std::chrono::milliseconds timeout{0};
    c10::intrusive_ptr<compat::C10dStore> store;    // this group's own prefix of the job store
    c10::intrusive_ptr<compat::C10dStore> root_store;  // the job store, for subgroups
    c10::intrusive_ptr<compat::C10dGroup> gloo;
    c10::intrusive_ptr<compat::C10dGroup> nccl;     // may be null
    compat::GlooDeviceSpec gloo_device;             // where Gloo binds, for subgroups too
    // Groups over one set of connections (view(), side_channel()); see
    // Note [One mesh per process].
    std::string connections_of;                     // the group that built them; empty: this one
    int tag_space = 0;                              // its share of the ring tags
    std::shared_ptr<std::atomic<int>> tag_spaces;   // the next free share, held by all of them
    bool out_of_order = false;                      // a side channel: Gloo rings only
  };
  explicit ProcessGroup(Parts parts);
  ~ProcessGroup();
  C10_DISABLE_COPY_AND_ASSIGN(ProcessGroup);

  int rank() const { return parts_.rank; }
  int size() const { return static_cast<int>(parts_.global_ranks.size()); }
  const std::string& name() const { return parts_.name; }
  std::chrono::milliseconds timeout() const { return parts_.timeout; }
  // The world rank of group rank `group_rank`.
  int global_rank(int group_rank) const;
  const std::vector<int>& global_ranks() const { return parts_.global_ranks; }

  // --- collectives (sync by default; async returns a pending Work) ---------
  std::shared_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum, bool async = false);
  std::shared_ptr<Work> broadcast(torch::Tensor& tensor, int root, bool async = false);
  // The reduction lands on `root` only; other ranks' tensors are undefined
  // afterwards (Gloo may use them as scratch).
  std::shared_ptr<Work> reduce(torch::Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum, bool async = false);
  // out.numel() == size() * in.numel(); rank r's input lands in the r-th slice.
  std::shared_ptr<Work> all_gather_into_tensor(torch::Tensor& out, const torch::Tensor& in, bool async = false);
  // in.numel() == size() * out.numel(); rank r receives the reduced r-th slice.
  std::shared_ptr<Work> reduce_scatter_tensor(torch::Tensor& out, const torch::Tensor& in,
                                              ReduceOp op = ReduceOp::kSum, bool async = false);
  // outs[r] = rank r's `in`; sizes may differ between ranks (same dtype and
  // number of dimensions). If `outs` already holds size() tensors of the right
  // shapes they are filled in place; otherwise the shapes are exchanged first.
  std::shared_ptr<Work> all_gather(std::vector<torch::Tensor>& outs, const torch::Tensor& in, bool async = false);
  std::shared_ptr<Work> barrier(bool async = false);
  // Tags below 2^30; the rest are lockstep's own.
  std::shared_ptr<Work> send(const torch::Tensor& tensor, int dst, int tag = 0, bool async = false);
  std::shared_ptr<Work> recv(torch::Tensor& tensor, int src, int tag = 0, bool async = false);

  // A group of some of this group's ranks (group ranks, any order). Every
  // member calls it, in the same order as the other members; non-members may
  // skip it and get nullptr when they call. `name` defaults to one derived
  // from the ranks; it must be unique among this job's groups.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, std::string name = "");

  // Note [One mesh per process]
  // A full Gloo mesh costs each rank a connection per peer (and on Gloo 1.13
  // a port per pair of a host's ranks while it connects), and each mesh is
  // N - 1 store round trips per rank to build. A DDP run used to build four:
  // world, DDP's, the metrics writer's and evaluation's -- 30 connections
  // per rank at 8 ranks, where one mesh needs 7 (tests/scale/
  // connections_test.cpp), and a host of 128 ranks ran out of ports. Now a
  // process holds one mesh per set of ranks; the groups that need the same
  // ranks use it:
  //   - view(): the same ranks over the same connections, in the same order.
  //     c10d numbers a group's collectives in the order they are issued (its
  //     tag), so a view's collectives take their place in this group's
  //     order: issue them from the thread that issues this group's, in the
  //     same order on every rank -- DDP's bucket all-reduces (issued from
  //     backward) and evaluation's gathers (the main thread) do. It keeps its
  //     own sequence numbers (for messages and the arrival board, so errors
  //     still name it) and its own ring tags, so a ring of it running on its
  //     executor never pairs with one of this group's.
  //   - side_channel(): the same ranks over the same connections, outside
  //     this group's order: another thread may use it, or its operations may
  //     be in flight between this group's (the metrics writer's gathers, FSDP's
  //     step check). On Gloo it runs only the collectives that lockstep runs
  //     as rings over send/recv with tags of its own (all_gather,
  //     all_gather_into_tensor, reduce_scatter_tensor); any other fails with
  //     a message that says so, rather than silently pairing with a
  //     collective of another thread. CUDA tensors get an NCCL communicator
  //     of their own: NCCL's setup is O(N), and a shared communicator would
  //     order them with this group's.
  // Neither connects nor touches the store, so neither is collective; every
  // rank must create a group's views and side channels in the same order (as
  // with new_group), which gives each the same share of the ring tags
  // everywhere. Groups of other ranks (new_group) still build meshes of their
  // own: a node's ranks, HYBRID_SHARD's shard and replica groups.
  std::shared_ptr<ProcessGroup> view(std::string name);
  std::shared_ptr<ProcessGroup> side_channel(std::string name);
  // The group whose connections this one uses: its own name unless it is a
  // view or side channel.
  const std::string& connections_of() const;

  // --- hierarchical all_reduce ---------------------------------------------
  // From now on all_reduce of a CPU tensor reduces to each node's first rank
  // (over loopback), all_reduces among those leaders (the only traffic across
  // the network: each leader moves 2 (nodes-1)/nodes of the tensor instead of
  // the ring's 2 (N-1)/N through every link), then broadcasts within the node.
  // Every rank ends with the same bits; the sum is taken in another order than
  // the flat ring's, so it equals the flat result to rounding, not bitwise.
  // After a failed stage every later hierarchical all_reduce of the group
  // fails at once with that error (the subgroups are out of step).
  // `node_of_rank[r]` is the node of group rank r (equal values = one node);
  // every rank passes the same vector. Collective (creates the subgroups).
  // Returns the hierarchy, for logs ("2 nodes of 2, 2 ranks"); returns
  // nothing and changes nothing when the split has one node or no node with
  // more than one rank, where the hierarchy would only add steps.
  // CUDA tensors keep NCCL's own (topology-aware) all_reduce.
  std::optional<std::string> enable_hierarchical_all_reduce(const std::vector<int>& node_of_rank);
  bool hierarchical_all_reduce() const { return hierarchy_ != nullptr; }

  // --- for benchmarks and advanced users -----------------------------------
  // The c10d backend `tensor` would use; without one, the Gloo backend (what
  // a CPU tensor uses).
  c10::intrusive_ptr<compat::C10dGroup> raw(const torch::Tensor& tensor = torch::Tensor()) const {
    return tensor.defined() && tensor.is_cuda() && parts_.nccl ? parts_.nccl : parts_.gloo;
  }
  // How reduce_scatter_tensor and all_gather_into_tensor move data from now
  // on (collective_algorithm() says what kAuto picks).
  void set_algorithms(CollectiveAlgorithms algorithms) { algorithms_ = algorithms; }

  // The store of this group (keys are private to it).
  const c10::intrusive_ptr<compat::C10dStore>& store() const { return parts_.store; }

 private:
  friend class Work;

  // A Work for the op `info` describes; a collective's takes the next
  // sequence number (detail::collective_info(*this, name, ++seq_)).
  std::shared_ptr<Work> make_work(detail::OpInfo info);
  // Runs `body` (which may block) inline for a sync op, on the group's
  // executor thread for an async one.
  std::shared_ptr<Work> run_algorithm(detail::OpInfo info, bool async, std::function<void()> body,
                                      std::function<void()> finish);
  // The parts of a view or side channel named `name` of this group.
  Parts shared_parts(std::string name);

  Parts parts_;
  long long seq_ = 0;
  CollectiveAlgorithms algorithms_;
  std::unique_ptr<detail::SerialExecutor> executor_;
  std::map<std::string, int> child_names_;
  std::shared_ptr<detail::NodeHierarchy> hierarchy_;
};

// The algorithm kAuto resolves to for `tensor` on `group` ("native" or "ring").
std::string collective_algorithm(const ProcessGroup& group, const torch::Tensor& tensor, bool reduce_scatter,
                                 ReduceOp op = ReduceOp::kSum);
// Whether kNative is available for `tensor` (and `op`) on `group`.
bool has_native_collective(const ProcessGroup& group, const torch::Tensor& tensor, bool reduce_scatter,
                           ReduceOp op = ReduceOp::kSum);

// "[0, 2, 5]": ranks as error and log messages show them.
std::string format_ranks(const std::vector<int>& ranks);

// The next name for a group of `kind` ("ddp0", "ddp1", ...). Identical on
// every rank as long as every rank creates its groups in the same order,
// which is what new_group needs of the names it is given.
std::string next_group_name(const std::string& kind);

}  // namespace lockstep
