#include "lockstep/comm/hierarchy.h"

#include <nlohmann/json.hpp>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/env.h"
#include "lockstep/comm/process_group.h"

namespace lockstep {

std::vector<int> node_of_each_rank(ProcessGroup& group, int ranks_per_node) {
  std::vector<int> nodes(static_cast<size_t>(group.size()));
  if (ranks_per_node > 0) {
    for (int r = 0; r < group.size(); ++r) nodes[static_cast<size_t>(r)] = r / ranks_per_node;
    return nodes;
  }
  // The world's own record when there is one (a group made from an MPI
  // communicator has no launcher variables to read).
  const int node_rank = is_initialized() ? dist_env().node_rank : detect_dist_env().node_rank;
  auto all = all_gather_object(nlohmann::json(node_rank), group.shared_from_this());
  for (int r = 0; r < group.size(); ++r) {
    nodes[static_cast<size_t>(r)] = all[static_cast<size_t>(r)].get<int>();
    if (nodes[static_cast<size_t>(r)] < 0) return {};
  }
  return nodes;
}

bool configure_hierarchical_all_reduce(ProcessGroup& group, const std::string& mode, int ranks_per_node,
                                       const std::string& who) {
  LOCKSTEP_CHECK(mode == "auto" || mode == "on" || mode == "off", who,
                 ": hierarchical_all_reduce is auto, on or off, not '", mode, "'");
  LOCKSTEP_CHECK(ranks_per_node >= 0, who, ": ranks_per_node must be 0 (from the launcher) or positive");
  if (mode == "off" || group.size() == 1) return false;
  const std::vector<int> nodes = node_of_each_rank(group, ranks_per_node);
  if (nodes.empty()) {
    LOCKSTEP_CHECK(mode != "on", who, ": hierarchical_all_reduce is on, but the launcher did not say which node each "
                   "rank runs on (no GROUP_RANK or SLURM_NODEID); set ranks_per_node");
    return false;
  }
  if (auto hierarchy = group.enable_hierarchical_all_reduce(nodes)) {
    logger().info("{} reduces gradients hierarchically: {} (within each node, then across nodes)", who, *hierarchy);
    return true;
  }
  if (mode == "on") {
    logger().warn("{}: hierarchical_all_reduce is on, but the ranks form one node or one rank per node, where the "
                  "flat all_reduce moves the same bytes; it stays flat", who);
  }
  return false;
}

std::string parse_hierarchical_mode(const Config& config, const std::string& fallback) {
  if (!config.has("hierarchical_all_reduce")) return fallback;
  const Config value = config.at("hierarchical_all_reduce");
  if (value.as<std::string>() == "auto") return "auto";
  return value.as<bool>() ? "on" : "off";
}

}  // namespace lockstep
