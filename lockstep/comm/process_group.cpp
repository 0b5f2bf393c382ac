#include "lockstep/comm/process_group.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "lockstep/core/error.h"
#include "lockstep/comm/internal/group_checks.h"
#include "lockstep/comm/internal/node_hierarchy.h"
#include "lockstep/comm/internal/ring.h"

namespace lockstep {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;  // kAvg divides afterwards
  }
}

detail::RingReduce to_ring(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return detail::RingReduce::kMax;
    case ReduceOp::kMin: return detail::RingReduce::kMin;
    default: return detail::RingReduce::kSum;
  }
}

// Gloo moves bytes by dtype and knows only float, double, half and 8/32/64-bit
// integers (some builds no 16-bit type at all: Note [Gloo's 16-bit types,
// asked]). Same-size stand-ins carry the others through unchanged; bytes
// carry 16-bit types where nothing of their size can (the tensor's storage
// receives them: callers hand in contiguous tensors and keep their own view).
at::Tensor gloo_move_view(const at::Tensor& tensor) {
  const compat::GlooCapabilities caps = compat::gloo_capabilities();
  switch (tensor.scalar_type()) {
    case at::kBFloat16:
      if (caps.moves_bfloat16) return tensor;
      return caps.knows_16_bit_types ? tensor.view(at::kHalf) : tensor.reshape({-1}).view(at::kByte);
    case at::kHalf:
    case at::kShort:
      if (caps.knows_16_bit_types) return tensor.scalar_type() == at::kHalf ? tensor : tensor.view(at::kHalf);
      return tensor.reshape({-1}).view(at::kByte);
    case at::kBool: return tensor.view(at::kByte);
    default: return tensor;
  }
}

// The dtype Gloo reduces a tensor in: a wider relative where Gloo lacks one.
at::ScalarType gloo_reduce_dtype(at::ScalarType type) {
  switch (type) {
    case at::kBFloat16: return compat::gloo_capabilities().reduces_bfloat16 ? type : at::kFloat;
    case at::kHalf: return compat::gloo_capabilities().knows_16_bit_types ? type : at::kFloat;
    case at::kShort: return at::kInt;
    case at::kBool: return at::kByte;
    default: return type;
  }
}

bool gloo_reduces_natively(at::ScalarType type) { return gloo_reduce_dtype(type) == type; }

void check_reduce_op(ReduceOp op, const at::Tensor& tensor, const char* what) {
  LOCKSTEP_CHECK(tensor.defined(), what, ": the tensor is undefined");
  if (op == ReduceOp::kAvg) {
    LOCKSTEP_CHECK(at::isFloatingType(tensor.scalar_type()), what,
                   ": ReduceOp::kAvg needs a floating-point tensor, got ", tensor.scalar_type(),
                   " (use kSum and divide, or convert first)");
  }
  LOCKSTEP_CHECK(!at::isComplexType(tensor.scalar_type()) || op == ReduceOp::kSum || op == ReduceOp::kAvg, what,
                 ": max/min of complex tensors is undefined");
}

// A contiguous tensor with `tensor`'s data and a way to write results back
// when a copy had to be made.
struct Staged {
  at::Tensor tensor;
  bool copied = false;
};

Staged contiguous(const at::Tensor& tensor) {
  if (tensor.is_contiguous()) return {tensor, false};
  return {tensor.contiguous(), true};
}

}  // namespace

std::string format_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

namespace detail {

bool on_nccl(const ProcessGroup& group, const torch::Tensor& tensor) {
  return tensor.is_cuda() && group.raw(tensor).get() != group.raw().get();
}

void check_rank(const ProcessGroup& group, int rank, const char* what) {
  LOCKSTEP_CHECK(rank >= 0 && rank < group.size(), what, ": rank ", rank, " is not in group '", group.name(), "' of ",
                 group.size(), " ranks");
}

void require_ordered(const ProcessGroup::Parts& parts, bool on_gloo, const char* op) {
  const std::string& connections_of = parts.connections_of.empty() ? parts.name : parts.connections_of;
  LOCKSTEP_CHECK(!parts.out_of_order || !on_gloo || parts.global_ranks.size() == 1, op, " on group '", parts.name,
                 "': this group is a side channel of group '", connections_of,
                 "' (Note [One mesh per process]): on Gloo it runs only all_gather, all_gather_into_tensor and "
                 "reduce_scatter_tensor, which move over send/recv with tags of their own; a c10d ", op,
                 " would take a place in group '", connections_of, "''s order from another thread. Use a "
                 "view() from the thread that issues that group's collectives, or a group of its own (new_group)");
}

OpInfo collective_info(const ProcessGroup& group, const char* op_name, long long seq) {
  OpInfo info;
  info.name = op_name;
  info.seq = seq;
  for (int r = 0; r < group.size(); ++r) {
    if (r != group.rank()) info.peers.push_back(r);
  }
  info.timeout = group.timeout();
  return info;
}

OpInfo p2p_info(std::string op_name, int peer, std::chrono::milliseconds timeout) {
  OpInfo info;
  info.name = std::move(op_name);
  info.peers = {peer};
  info.timeout = timeout;
  return info;
}

std::shared_ptr<Work> finish_issue(std::shared_ptr<Work> work, bool async) {
  if (!async) work->wait();
  return work;
}

}  // namespace detail

namespace {

// How send and recv name themselves in their checks and their bookkeeping.
struct PointToPoint {
  const char* op;            // "send"
  const char* toward;        // "to": "send to rank 3 (tag 0)"
  const char* self_refusal;  // "cannot send to itself"
};
constexpr PointToPoint kSend{"send", "to", "cannot send to itself"};
constexpr PointToPoint kRecv{"recv", "from", "cannot receive from itself"};

// The checks send and recv share (a defined tensor, a peer in the group other
// than this rank, an ordered backend, a user tag), then the op's bookkeeping.
detail::OpInfo checked_p2p_info(const ProcessGroup& group, const ProcessGroup::Parts& parts,
                                const torch::Tensor& tensor, int peer, int tag, const PointToPoint& p2p) {
  LOCKSTEP_CHECK(tensor.defined(), p2p.op, ": the tensor is undefined");
  detail::check_rank(group, peer, p2p.op);
  LOCKSTEP_CHECK(peer != group.rank(), p2p.op, ": rank ", group.global_rank(group.rank()), " ", p2p.self_refusal);
  detail::require_ordered(parts, !detail::on_nccl(group, tensor), p2p.op);
  LOCKSTEP_CHECK(tag >= 0 && tag < detail::kFirstReservedTag, p2p.op, ": tag ", tag, " is outside [0, 2^30)");
  return detail::p2p_info(str_cat(p2p.op, " ", p2p.toward, " rank ", group.global_rank(peer), " (tag ", tag, ")"),
                          peer, group.timeout());
}

// The checks of an op between a whole tensor and this rank's 1/size() part of
// it (all_gather_into_tensor: out whole; reduce_scatter_tensor: in whole): one
// dtype, the whole's numel size() times the part's, one device.
void check_whole_and_part(const ProcessGroup& group, const char* op, const torch::Tensor& out, const torch::Tensor& in,
                          bool out_is_whole) {
  LOCKSTEP_CHECK(out.scalar_type() == in.scalar_type(), op, ": output dtype ", out.scalar_type(),
                 " differs from input dtype ", in.scalar_type());
  const torch::Tensor& whole = out_is_whole ? out : in;
  const torch::Tensor& part = out_is_whole ? in : out;
  LOCKSTEP_CHECK(whole.numel() == part.numel() * group.size(), op, " on group '", group.name(), "': ",
                 out_is_whole ? "output" : "input", " has ", whole.numel(), " elements, expected ", group.size(), " x ",
                 part.numel());
  LOCKSTEP_CHECK(out.device() == in.device(), op, ": tensors on different devices");
}

// What all_gather and all_gather_into_tensor run where the op is not native:
// this rank's piece (flat_in) into its own chunk, then the others' pieces by
// all_gather_pieces (the ring alone where ring_only), within the timeout from now.
std::function<void()> all_gather_body(const ProcessGroup& group, const at::Tensor& flat_in,
                                      std::vector<at::Tensor> chunks, int tag, bool ring_only) {
  auto raw = group.raw(flat_in);
  const int my_rank = group.rank(), world = group.size();
  const auto deadline = std::chrono::steady_clock::now() + group.timeout();
  return [raw, my_rank, world, chunks = std::move(chunks), flat_in, tag, deadline, ring_only]() mutable {
    chunks[static_cast<size_t>(my_rank)].copy_(flat_in);
    detail::all_gather_pieces(*raw, my_rank, world, chunks, tag, deadline, ring_only);
  };
}

}  // namespace

ProcessGroup::ProcessGroup(Parts parts) : parts_(std::move(parts)) {
  LOCKSTEP_CHECK(parts_.gloo, "ProcessGroup '", parts_.name, "': no Gloo backend");
  LOCKSTEP_CHECK(parts_.rank >= 0 && parts_.rank < size(), "ProcessGroup '", parts_.name, "': rank ", parts_.rank,
                 " is outside [0, ", size(), ")");
  if (!parts_.tag_spaces) parts_.tag_spaces = std::make_shared<std::atomic<int>>(parts_.tag_space + 1);
}

ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::global_rank(int group_rank) const {
  LOCKSTEP_CHECK(group_rank >= 0 && group_rank < size(), "group '", name(), "' has no rank ", group_rank);
  return parts_.global_ranks[static_cast<size_t>(group_rank)];
}

bool has_native_collective(const ProcessGroup& group, const torch::Tensor& tensor, bool reduce_scatter, ReduceOp op) {
  if (detail::on_nccl(group, tensor)) return true;
  auto caps = compat::gloo_capabilities();
  if (!reduce_scatter) return caps.allgather_base;
  bool sums = op == ReduceOp::kSum || op == ReduceOp::kAvg;
  return caps.reduce_scatter_base && gloo_reduces_natively(tensor.scalar_type()) &&
         (sums || caps.reduce_scatter_base_max_min);
}

std::string collective_algorithm(const ProcessGroup& group, const torch::Tensor& tensor, bool /*reduce_scatter*/,
                                 ReduceOp /*op*/) {
  // Gloo's native ops (libtorch 2.x) lose to the ring on 2 ranks: its
  // _reduce_scatter_base costs what all_reduce-then-slice costs (2.2x the
  // ring) and its _allgather_base 1.2-4x the ring (bench/collectives), so
  // Gloo always takes the ring; NCCL's native ops are the real thing.
  return detail::on_nccl(group, tensor) ? "native" : "ring";
}

std::shared_ptr<Work> ProcessGroup::make_work(detail::OpInfo info) {
  return std::shared_ptr<Work>(new Work(shared_from_this(), std::move(info)));
}

std::shared_ptr<Work> ProcessGroup::run_algorithm(detail::OpInfo info, bool async, std::function<void()> body,
                                                  std::function<void()> finish) {
  auto work = make_work(std::move(info));
  work->finish_ = std::move(finish);
  work->has_future_ = true;
  if (async) {
    if (!executor_) executor_ = std::make_unique<detail::SerialExecutor>();
    work->future_ = executor_->submit(std::move(body));
    return work;
  }
  std::promise<void> done;
  try {
    body();
    done.set_value();
  } catch (...) {
    done.set_exception(std::current_exception());
  }
  work->future_ = done.get_future().share();
  work->wait();
  return work;
}

std::shared_ptr<Work> ProcessGroup::all_reduce(torch::Tensor& tensor, ReduceOp op, bool async) {
  check_reduce_op(op, tensor, "all_reduce");
  const bool average = op == ReduceOp::kAvg;
  const int world = size();
  if (detail::on_nccl(*this, tensor)) {
    auto work = make_work(detail::collective_info(*this, "all_reduce", ++seq_));
    auto staged = contiguous(tensor);
    std::vector<at::Tensor> tensors{staged.tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    work->raw_.push_back(parts_.nccl->allreduce(tensors, options));
    work->finish_ = [tensor, staged, average, world]() mutable {
      if (average) staged.tensor.div_(world);
      if (staged.copied) tensor.copy_(staged.tensor);
    };
    return detail::finish_issue(std::move(work), async);
  }
  detail::require_ordered(parts_, true, "all_reduce");
  at::ScalarType reduce_type = gloo_reduce_dtype(tensor.scalar_type());
  Staged staged = reduce_type == tensor.scalar_type() ? contiguous(tensor)
                                                      : Staged{tensor.to(reduce_type).contiguous(), true};
  auto finish = [tensor, staged, average, world]() mutable {
    if (average && world > 1) staged.tensor.div_(world);
    if (staged.copied) tensor.copy_(staged.tensor);
  };
  if (hierarchy_) {
    // Synchronous ones queue behind the asynchronous ones too: the stages'
    // order is the order of issue, on every rank.
    auto work = make_work(detail::collective_info(*this, "hierarchical all_reduce", ++seq_));
    work->finish_ = finish;
    work->has_future_ = true;
    work->future_ = hierarchy_->all_reduce(staged.tensor, average ? ReduceOp::kSum : op);
    return detail::finish_issue(std::move(work), async);
  }
  auto work = make_work(detail::collective_info(*this, "all_reduce", ++seq_));
  if (world > 1) {
    std::vector<at::Tensor> tensors{staged.tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    work->raw_.push_back(parts_.gloo->allreduce(tensors, options));
  }
  work->finish_ = finish;
  return detail::finish_issue(std::move(work), async);
}

std::shared_ptr<Work> ProcessGroup::reduce(torch::Tensor& tensor, int root, ReduceOp op, bool async) {
  check_reduce_op(op, tensor, "reduce");
  detail::check_rank(*this, root, "reduce");
  detail::require_ordered(parts_, !detail::on_nccl(*this, tensor), "reduce");
  auto work = make_work(detail::collective_info(*this, "reduce", ++seq_));
  const bool average = op == ReduceOp::kAvg;
  const int world = size();
  at::ScalarType reduce_type =
      detail::on_nccl(*this, tensor) ? tensor.scalar_type() : gloo_reduce_dtype(tensor.scalar_type());
  Staged staged = reduce_type == tensor.scalar_type() ? contiguous(tensor)
                                                      : Staged{tensor.to(reduce_type).contiguous(), true};
  if (world > 1) {
    std::vector<at::Tensor> tensors{staged.tensor};
    c10d::ReduceOptions options;
    options.reduceOp = to_c10d(op);
    options.rootRank = root;
    work->raw_.push_back(raw(tensor)->reduce(tensors, options));
  }
  if (rank() == root) {
    work->finish_ = [tensor, staged, average, world]() mutable {
      if (average && world > 1) staged.tensor.div_(world);
      if (staged.copied) tensor.copy_(staged.tensor);
    };
  }
  return detail::finish_issue(std::move(work), async);
}

std::shared_ptr<Work> ProcessGroup::broadcast(torch::Tensor& tensor, int root, bool async) {
  LOCKSTEP_CHECK(tensor.defined(), "broadcast: the tensor is undefined");
  detail::check_rank(*this, root, "broadcast");
  detail::require_ordered(parts_, !detail::on_nccl(*this, tensor), "broadcast");
  auto info = detail::collective_info(*this, "broadcast", ++seq_);
  info.peers = rank() == root ? info.peers : std::vector<int>{root};
  auto work = make_work(std::move(info));
  Staged staged = contiguous(tensor);
  if (size() > 1) {
    std::vector<at::Tensor> tensors{detail::on_nccl(*this, tensor) ? staged.tensor : gloo_move_view(staged.tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    work->raw_.push_back(raw(tensor)->broadcast(tensors, options));
  }
  if (staged.copied && rank() != root) {
    work->finish_ = [tensor, staged]() mutable { tensor.copy_(staged.tensor); };
  }
  return detail::finish_issue(std::move(work), async);
}

std::shared_ptr<Work> ProcessGroup::all_gather_into_tensor(torch::Tensor& out, const torch::Tensor& in, bool async) {
  LOCKSTEP_CHECK(out.defined() && in.defined(), "all_gather_into_tensor: undefined tensor");
  check_whole_and_part(*this, "all_gather_into_tensor", out, in, /*out_is_whole=*/true);
  auto info = detail::collective_info(*this, "all_gather_into_tensor", ++seq_);
  Staged staged_out = contiguous(out);
  at::Tensor flat_out = staged_out.tensor.view(-1);
  at::Tensor flat_in = in.contiguous().view(-1);
  auto finish = [out, staged_out]() mutable {
    if (staged_out.copied) out.copy_(staged_out.tensor);
  };
  std::string algorithm = collective_algorithm(*this, in, false);
  if (algorithms_.all_gather == CollectiveAlgorithm::kRing) algorithm = "ring";
  if (algorithms_.all_gather == CollectiveAlgorithm::kNative) {
    LOCKSTEP_CHECK(has_native_collective(*this, in, false),
                   "all_gather_into_tensor: this backend has no native op (libtorch ",
                   compat::torch_version(), ")");
    algorithm = "native";
  }
  LOCKSTEP_CHECK(algorithms_.all_gather != CollectiveAlgorithm::kAllReduce,
                 "all_gather_into_tensor: CollectiveAlgorithm::kAllReduce applies to reduce_scatter only");
  if (algorithm == "native") {
    detail::require_ordered(parts_, !detail::on_nccl(*this, in), "all_gather_into_tensor (native)");
  }
  if (size() == 1 || algorithm == "native") {
    auto work = make_work(std::move(info));
    if (size() == 1) {
      flat_out.copy_(flat_in);
    } else {
      bool nccl = detail::on_nccl(*this, in);
      at::Tensor gather_out = nccl ? flat_out : gloo_move_view(flat_out);
      at::Tensor gather_in = nccl ? flat_in : gloo_move_view(flat_in);
      work->raw_.push_back(raw(in)->_allgather_base(gather_out, gather_in));
    }
    work->finish_ = finish;
    return detail::finish_issue(std::move(work), async);
  }
  const int64_t n = flat_in.numel();
  std::vector<at::Tensor> chunks;
  for (int r = 0; r < size(); ++r) chunks.push_back(flat_out.narrow(0, r * n, n));
  const int tag = detail::ring_tag(info.seq, parts_.tag_space);
  const bool ring_only = algorithms_.all_gather == CollectiveAlgorithm::kRing;
  auto body = all_gather_body(*this, flat_in, std::move(chunks), tag, ring_only);
  return run_algorithm(std::move(info), async, std::move(body), std::move(finish));
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_tensor(torch::Tensor& out, const torch::Tensor& in, ReduceOp op,
                                                          bool async) {
  check_reduce_op(op, in, "reduce_scatter_tensor");
  LOCKSTEP_CHECK(out.defined(), "reduce_scatter_tensor: the output is undefined");
  check_whole_and_part(*this, "reduce_scatter_tensor", out, in, /*out_is_whole=*/false);
  auto info = detail::collective_info(*this, "reduce_scatter_tensor", ++seq_);
  const bool average = op == ReduceOp::kAvg;
  const int world = size();
  Staged staged_out = contiguous(out);
  at::Tensor flat_out = staged_out.tensor.view(-1);
  at::Tensor flat_in = in.contiguous().view(-1);
  auto finish = [out, staged_out, average, world]() mutable {
    if (average && world > 1) staged_out.tensor.div_(world);
    if (staged_out.copied) out.copy_(staged_out.tensor);
  };
  std::string algorithm = collective_algorithm(*this, in, true, op);
  switch (algorithms_.reduce_scatter) {
    case CollectiveAlgorithm::kAuto: break;
    case CollectiveAlgorithm::kRing: algorithm = "ring"; break;
    case CollectiveAlgorithm::kAllReduce: algorithm = "all_reduce"; break;
    case CollectiveAlgorithm::kNative:
      LOCKSTEP_CHECK(has_native_collective(*this, in, true, op),
                     "reduce_scatter_tensor: this backend has no native op for ",
                     in.scalar_type(), " with ReduceOp ", to_string(op), " (libtorch ", compat::torch_version(), ")");
      algorithm = "native";
      break;
  }
  if (world == 1) {
    auto work = make_work(std::move(info));
    flat_out.copy_(flat_in);
    work->finish_ = finish;
    return detail::finish_issue(std::move(work), async);
  }
  if (algorithm != "ring") {
    detail::require_ordered(parts_, !detail::on_nccl(*this, in), "reduce_scatter_tensor (native or all_reduce)");
  }
  if (algorithm == "native") {
    auto work = make_work(std::move(info));
    c10d::ReduceScatterOptions options;
    options.reduceOp = to_c10d(op);
    work->raw_.push_back(raw(in)->_reduce_scatter_base(flat_out, flat_in, options));
    work->finish_ = finish;
    return detail::finish_issue(std::move(work), async);
  }
  if (algorithm == "all_reduce") {
    // The baseline the ring is measured against: reduce everything, keep a slice.
    auto work = make_work(std::move(info));
    at::ScalarType reduce_type = detail::on_nccl(*this, in) ? in.scalar_type() : gloo_reduce_dtype(in.scalar_type());
    at::Tensor everything = flat_in.to(reduce_type, /*non_blocking=*/false, /*copy=*/true);
    std::vector<at::Tensor> tensors{everything};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    work->raw_.push_back(raw(in)->allreduce(tensors, options));
    const int64_t n = flat_out.numel();
    int my_rank = rank();
    work->finish_ = [flat_out, everything, n, my_rank, finish]() mutable {
      flat_out.copy_(everything.narrow(0, my_rank * n, n));
      finish();
    };
    return detail::finish_issue(std::move(work), async);
  }
  auto group = raw(in);
  int my_rank = rank(), tag = detail::ring_tag(info.seq, parts_.tag_space);
  auto reduce = to_ring(op);
  auto deadline = std::chrono::steady_clock::now() + parts_.timeout;
  auto body = [group, my_rank, world, flat_in, flat_out, reduce, tag, deadline]() mutable {
    detail::ring_reduce_scatter(*group, my_rank, world, flat_in, flat_out, reduce, tag, deadline);
  };
  return run_algorithm(std::move(info), async, std::move(body), std::move(finish));
}

namespace {

// One row per rank: dtype, number of dimensions, then the sizes.
std::vector<int64_t> gather_shapes(ProcessGroup& group, const torch::Tensor& in) {
  constexpr int64_t kRow = 18;
  LOCKSTEP_CHECK(in.dim() <= kRow - 2, "all_gather: tensors with more than ", kRow - 2, " dimensions");
  auto mine = torch::zeros({kRow}, torch::kLong);
  mine[0] = static_cast<int64_t>(in.scalar_type());
  mine[1] = in.dim();
  for (int64_t d = 0; d < in.dim(); ++d) mine[2 + d] = in.size(d);
  auto all = torch::empty({group.size() * kRow}, torch::kLong);
  group.all_gather_into_tensor(all, mine);
  std::vector<int64_t> flat(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
  return flat;
}

}  // namespace

std::shared_ptr<Work> ProcessGroup::all_gather(std::vector<torch::Tensor>& outs, const torch::Tensor& in,
                                               bool async) {
  LOCKSTEP_CHECK(in.defined(), "all_gather: the input is undefined");
  bool presized = outs.size() == static_cast<size_t>(size()) &&
                  std::all_of(outs.begin(), outs.end(), [](const torch::Tensor& t) { return t.defined(); });
  if (presized) {
    LOCKSTEP_CHECK(outs[static_cast<size_t>(rank())].numel() == in.numel(), "all_gather on group '", name(),
                   "': outs[", rank(), "] has ", outs[static_cast<size_t>(rank())].numel(),
                   " elements but this rank's input has ", in.numel());
    for (const auto& out : outs) {
      LOCKSTEP_CHECK(out.scalar_type() == in.scalar_type(), "all_gather: output dtype ", out.scalar_type(),
                     " differs from input dtype ", in.scalar_type());
    }
  } else {
    constexpr int kRow = 18;
    auto rows = gather_shapes(*this, in);
    outs.clear();
    for (int r = 0; r < size(); ++r) {
      const int64_t* row = rows.data() + r * kRow;
      LOCKSTEP_CHECK(row[0] == static_cast<int64_t>(in.scalar_type()), "all_gather on group '", name(), "': rank ",
                     global_rank(r), " sends ", static_cast<at::ScalarType>(row[0]), " but rank ",
                     global_rank(rank()), " sends ", in.scalar_type());
      LOCKSTEP_CHECK(row[1] == in.dim(), "all_gather on group '", name(), "': rank ", global_rank(r), " sends a ",
                     row[1], "-d tensor but rank ", global_rank(rank()), " a ", in.dim(), "-d one");
      std::vector<int64_t> shape(row + 2, row + 2 + row[1]);
      outs.push_back(torch::empty(shape, in.options()));
    }
  }
  auto info = detail::collective_info(*this, "all_gather", ++seq_);
  std::vector<at::Tensor> chunks;
  std::vector<Staged> staged;
  for (auto& out : outs) {
    staged.push_back(contiguous(out));
    chunks.push_back(staged.back().tensor.view(-1));
  }
  auto finish = [outs, staged]() mutable {
    for (size_t r = 0; r < outs.size(); ++r) {
      if (staged[r].copied) outs[r].copy_(staged[r].tensor);
    }
  };
  const int tag = detail::ring_tag(info.seq, parts_.tag_space);
  const bool ring_only = algorithms_.all_gather == CollectiveAlgorithm::kRing;
  auto body = all_gather_body(*this, in.contiguous().view(-1), std::move(chunks), tag, ring_only);
  return run_algorithm(std::move(info), async, std::move(body), std::move(finish));
}

std::shared_ptr<Work> ProcessGroup::barrier(bool async) {
  detail::require_ordered(parts_, true, "barrier");
  auto work = make_work(detail::collective_info(*this, "barrier", ++seq_));
  if (size() > 1) work->raw_.push_back(parts_.gloo->barrier());
  return detail::finish_issue(std::move(work), async);
}

std::shared_ptr<Work> ProcessGroup::send(const torch::Tensor& tensor, int dst, int tag, bool async) {
  auto work = make_work(checked_p2p_info(*this, parts_, tensor, dst, tag, kSend));
  auto group = raw(tensor);
  std::vector<at::Tensor> tensors{detail::p2p_tensor(*group, tensor.contiguous())};
  work->raw_.push_back(group->send(tensors, dst, tag));
  return detail::finish_issue(std::move(work), async);
}

std::shared_ptr<Work> ProcessGroup::recv(torch::Tensor& tensor, int src, int tag, bool async) {
  auto work = make_work(checked_p2p_info(*this, parts_, tensor, src, tag, kRecv));
  auto group = raw(tensor);
  Staged staged = contiguous(tensor);
  at::Tensor buffer = detail::p2p_tensor(*group, staged.tensor, /*for_receiving=*/true);
  std::vector<at::Tensor> tensors{buffer};
  work->raw_.push_back(group->recv(tensors, src, tag));
  if (!buffer.is_same(tensor)) work->finish_ = [tensor, buffer]() mutable { tensor.copy_(buffer); };
  return detail::finish_issue(std::move(work), async);
}

}  // namespace lockstep
