// How groups are made from a ProcessGroup: new_group (a mesh of its own for
// some of its ranks), view and side_channel (the same ranks over its
// connections, Note [One mesh per process] in process_group.h), the
// hierarchical all-reduce's subgroups, and the names every rank agrees on.
// The collectives themselves are in process_group.cpp.
#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "lockstep/core/error.h"
#include "lockstep/comm/internal/group_checks.h"
#include "lockstep/comm/internal/node_hierarchy.h"
#include "lockstep/comm/internal/store_views.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/comm/rendezvous.h"
#include "lockstep/comm/internal/ring.h"

namespace lockstep {

namespace {

// Guards every group's child_names_ (new_group, view, side_channel).
std::mutex& child_naming() {
  static std::mutex mutex;
  return mutex;
}


}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks, std::string group_name) {
  LOCKSTEP_CHECK(!ranks.empty(), "new_group on group '", name(), "': no ranks given");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    detail::check_rank(*this, ranks[i], "new_group");
    LOCKSTEP_CHECK(i == 0 || ranks[i] != ranks[i - 1], "new_group on group '", name(), "': rank ", ranks[i],
                   " is listed twice");
  }
  auto me = std::find(ranks.begin(), ranks.end(), rank());
  if (me == ranks.end()) return nullptr;
  std::string store_name;
  {
    // Groups may be built from several threads at once (a user's, as
    // tests/comm/collectives_test.cpp does). Only the name is taken
    // under the lock: holding it through the rendezvous below would deadlock
    // when two ranks build two groups in different orders (rank 0's main
    // thread waits in "side" for rank 1, whose metrics thread holds the lock
    // waiting in "metrics" for rank 0, whose metrics thread waits for the lock).
    // The store connection has the same trap; see the exchange below.
    std::lock_guard<std::mutex> lock(child_naming());
    if (group_name.empty()) {
      std::string base = str_cat(name() == "world" ? "" : name() + "/", "ranks", format_ranks(ranks));
      int count = ++child_names_[base];
      group_name = count > 1 ? str_cat(base, "#", count) : base;
    } else {
      LOCKSTEP_CHECK(child_names_[group_name]++ == 0, "new_group: a group named '", group_name,
                     "' was already created from group '", name(), "'");
    }
  }
  Parts child;
  child.name = group_name;
  child.rank = static_cast<int>(me - ranks.begin());
  for (int r : ranks) child.global_ranks.push_back(global_rank(r));
  child.timeout = parts_.timeout;
  child.root_store = parts_.root_store;
  child.gloo_device = parts_.gloo_device;
  child.store = compat::make_prefix_store(str_cat("group/", name(), "/", group_name, "/"), parts_.root_store);
  const int child_size = static_cast<int>(ranks.size());
  // Another thread may be building a group through the same store client
  // (Note [Waiting without holding the store]), unless the world is being set up.
  auto polling = [&](c10::intrusive_ptr<compat::C10dStore> store) {
    if (BlockingStoreWaits::active()) return store;
    return make_polling_store(std::move(store), child.timeout, str_cat("group '", group_name, "'"));
  };
  rendezvous(polling(child.store), group_name, child.rank, child_size, child.timeout,
             "every member must call new_group with the same ranks");
  auto exchange = [&](const char* backend) { return polling(compat::make_prefix_store(backend, child.store)); };
  try {
    child.gloo = make_gloo_mesh(exchange("gloo/"), child.rank, child_size, child.timeout, child.gloo_device);
    if (parts_.nccl) child.nccl = compat::make_nccl(exchange("nccl/"), child.rank, child_size, child.timeout);
  } catch (const std::exception&) {
    rethrow_with_context(str_cat("rank ", global_rank(rank()), ": creating group '", group_name, "'"));
  }
  return std::make_shared<ProcessGroup>(std::move(child));
}

const std::string& ProcessGroup::connections_of() const {
  return parts_.connections_of.empty() ? parts_.name : parts_.connections_of;
}

ProcessGroup::Parts ProcessGroup::shared_parts(std::string group_name) {
  {
    std::lock_guard<std::mutex> lock(child_naming());  // views may be made from several threads too
    LOCKSTEP_CHECK(!group_name.empty(), "a view or side channel of group '", name(), "' needs a name; the name is empty");
    LOCKSTEP_CHECK(child_names_[group_name]++ == 0, "a group named '", group_name, "' was already created from group '",
                   name(), "'");
  }
  Parts parts = parts_;
  parts.name = group_name;
  parts.store = compat::make_prefix_store(str_cat("group/", name(), "/", group_name, "/"), parts_.root_store);
  parts.connections_of = connections_of();
  // A view of a side channel is out of the order too (parts_ says so).
  parts.tag_space = (*parts_.tag_spaces)++;
  LOCKSTEP_CHECK(parts.tag_space < detail::kRingTagSpaces, "group '", group_name, "': more than ",
                 detail::kRingTagSpaces, " groups share the connections of group '", connections_of(), "'");
  return parts;
}

std::shared_ptr<ProcessGroup> ProcessGroup::view(std::string group_name) {
  return std::make_shared<ProcessGroup>(shared_parts(std::move(group_name)));
}

// A side channel's Gloo rings call c10d's send and recv on the shared group
// from another thread while this one issues collectives. That is safe:
// c10d hands them straight to Gloo's pairs, which lock, and tags them with
// the channel's own share of the tags; c10d's collective counter (the tag
// of its collectives) is touched only by collectives. libtorch 2.x also
// counts every op in an unsynchronised `seq_`, used only to number works for
// debugging: a count there may be off, nothing else.
std::shared_ptr<ProcessGroup> ProcessGroup::side_channel(std::string group_name) {
  Parts parts = shared_parts(std::move(group_name));
  parts.out_of_order = true;
  if (parts_.nccl && size() > 1) {
    try {
      auto exchange = make_polling_store(compat::make_prefix_store("nccl/", parts.store), parts.timeout,
                                         str_cat("group '", parts.name, "'"));
      parts.nccl = compat::make_nccl(exchange, parts.rank, size(), parts.timeout);
    } catch (const std::exception&) {
      rethrow_with_context(str_cat("rank ", global_rank(rank()), ": creating group '", parts.name, "'"));
    }
  }
  return std::make_shared<ProcessGroup>(std::move(parts));
}

std::optional<std::string> ProcessGroup::enable_hierarchical_all_reduce(const std::vector<int>& node_of_rank) {
  LOCKSTEP_CHECK(static_cast<int>(node_of_rank.size()) == size(), "enable_hierarchical_all_reduce on group '", name(),
                 "': ", node_of_rank.size(), " node ids for ", size(), " ranks");
  LOCKSTEP_CHECK(!hierarchy_, "group '", name(), "' already reduces hierarchically");
  detail::require_ordered(parts_, true, "enable_hierarchical_all_reduce");
  hierarchy_ = detail::NodeHierarchy::create(*this, node_of_rank);
  if (!hierarchy_) return std::nullopt;
  return hierarchy_->description;
}

std::string next_group_name(const std::string& kind) {
  static std::mutex mutex;
  static std::map<std::string, int> counters;
  std::lock_guard<std::mutex> lock(mutex);
  return kind + std::to_string(counters[kind]++);
}

}  // namespace lockstep
