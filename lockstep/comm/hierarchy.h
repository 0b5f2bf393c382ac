// Which node each rank runs on, and switching a group to the hierarchical
// all_reduce when that pays (ProcessGroup::enable_hierarchical_all_reduce):
// the one place DDP's buckets and FSDP's replica reductions decide it.
//
//   // mode: "auto" (when the group spans nodes and some node runs several of
//   // its ranks), "on" (insist), "off"; ranks_per_node 0: from the launcher.
//   bool on = lockstep::configure_hierarchical_all_reduce(*group, "auto", 0, "DDP");
//
// The launcher says where each rank runs through GROUP_RANK (torchrun,
// `lockstep run`) or SLURM_NODEID; hostnames are not used, since network
// namespaces (and containers) share one.
#pragma once

#include <string>
#include <vector>

#include "lockstep/config/config.h"

namespace lockstep {

class ProcessGroup;

// The node of each rank of `group`: runs of `ranks_per_node` consecutive
// ranks when it is positive, else the launcher's node rank of each member
// (collective). Empty when some rank's launcher did not say.
std::vector<int> node_of_each_rank(ProcessGroup& group, int ranks_per_node);

// Collective over `group`. Logs the outcome under `who` ("DDP", "FSDP").
bool configure_hierarchical_all_reduce(ProcessGroup& group, const std::string& mode, int ranks_per_node,
                                       const std::string& who);

// A config value of hierarchical_all_reduce (auto | true | false) as a mode.
std::string parse_hierarchical_mode(const Config& config, const std::string& fallback);

}  // namespace lockstep
