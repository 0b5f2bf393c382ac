#include "lockstep/comm/internal/node_hierarchy.h"

#include <algorithm>
#include <map>
#include <sstream>


namespace lockstep::detail {

namespace {

// Pieces of at most this many bytes go through the stages one after the
// other: only the first piece's reduce and the last piece's broadcast add to
// the time on the link.
constexpr int64_t kPieceBytes = int64_t{4} << 20;

}  // namespace

std::shared_ptr<NodeHierarchy> NodeHierarchy::create(ProcessGroup& group, const std::vector<int>& node_of_rank) {
  std::map<int, std::vector<int>> members;  // node id -> group ranks, ascending
  for (int r = 0; r < group.size(); ++r) members[node_of_rank[static_cast<size_t>(r)]].push_back(r);
  size_t largest = 0;
  for (const auto& node : members) largest = std::max(largest, node.second.size());
  if (members.size() < 2 || largest < 2) return nullptr;
  auto hierarchy = std::make_shared<NodeHierarchy>();
  const std::vector<int>& mine = members[node_of_rank[static_cast<size_t>(group.rank())]];
  if (mine.size() > 1) {
    hierarchy->node_reduce = group.new_group(mine);
    hierarchy->node_broadcast = group.new_group(mine);
  }
  std::vector<int> leaders;
  for (const auto& node : members) leaders.push_back(node.second.front());
  if (mine.front() == group.rank()) hierarchy->leaders = group.new_group(leaders);
  std::ostringstream text;
  text << members.size() << " nodes of ";
  size_t i = 0;
  for (const auto& node : members) text << (i++ ? ", " : "") << node.second.size();
  text << " ranks";
  hierarchy->description = text.str();
  return hierarchy;
}

std::shared_future<void> NodeHierarchy::all_reduce(const at::Tensor& data, ReduceOp op) {
  at::Tensor flat = data.view(-1);
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(flat.element_size()));
  const int64_t pieces = std::max<int64_t>(1, (flat.numel() + piece - 1) / piece);
  std::vector<std::shared_future<void>> done;
  for (int64_t i = 0; i < pieces; ++i) {
    at::Tensor part = flat.narrow(0, i * piece, std::min(piece, flat.numel() - i * piece));
    auto reduced = reduce_stage_.submit([this, part, op]() mutable {
      guarded([&] {
        if (node_reduce) node_reduce->reduce(part, 0, op);
      });
    });
    auto crossed = cross_stage_.submit([this, part, op, reduced]() mutable {
      guarded([&] {
        reduced.get();
        if (leaders) leaders->all_reduce(part, op);
      });
    });
    done.push_back(broadcast_stage_.submit([this, part, crossed]() mutable {
      guarded([&] {
        crossed.get();
        if (node_broadcast) node_broadcast->broadcast(part, 0);
      });
    }));
  }
  if (done.size() == 1) return done.front();
  // Done when every piece is; a failed piece fails the whole.
  return broadcast_stage_.submit([done]() {
    for (const auto& piece_done : done) piece_done.get();
  });
}

void NodeHierarchy::guarded(const std::function<void()>& body) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failure_) std::rethrow_exception(failure_);
  }
  try {
    body();
  } catch (...) {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failure_) failure_ = std::current_exception();
    throw;
  }
}

}  // namespace lockstep::detail
