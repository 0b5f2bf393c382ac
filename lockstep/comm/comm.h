// detectron2-style helpers for code that must run alike with one process or
// many: rank queries that are safe before initialisation, a barrier that is a
// no-op alone, collectives of serialisable objects, and metric reduction.
//
//   if (lockstep::is_main_process()) write_checkpoint();
//   lockstep::synchronize();
//   auto names = lockstep::all_gather_object(std::string(hostname));   // one per rank
//   nlohmann::json stats = lockstep::broadcast_object(stats, /*src=*/0);
//   auto losses = lockstep::reduce_dict({{"loss", 0.5}}, /*average=*/true);
//   torch::manual_seed(lockstep::shared_random_seed());
//
// The object collectives default to the world group and take another group
// as the last argument. Objects are std::string (bytes) or nlohmann::json
// (sent as its text).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/comm/process_group.h"

namespace lockstep {

// 0 / 1 / 0 before initialisation.
int get_rank();
int get_world_size();
int get_local_rank();
int get_local_size();
bool is_main_process();

// A barrier on the world; nothing when uninitialised or alone.
void synchronize();

// Every rank gets every rank's object, in rank order. `group` null = world.
std::vector<std::string> all_gather_object(const std::string& object,
                                           const std::shared_ptr<ProcessGroup>& group = nullptr);
std::vector<nlohmann::json> all_gather_object(const nlohmann::json& object,
                                              const std::shared_ptr<ProcessGroup>& group = nullptr);

// Rank `dst` gets every rank's object; the others get an empty vector.
std::vector<std::string> gather_object(const std::string& object, int dst = 0,
                                       const std::shared_ptr<ProcessGroup>& group = nullptr);
std::vector<nlohmann::json> gather_object(const nlohmann::json& object, int dst = 0,
                                          const std::shared_ptr<ProcessGroup>& group = nullptr);

// Every rank gets rank `src`'s object (the others' argument is ignored).
std::string broadcast_object(const std::string& object, int src = 0,
                             const std::shared_ptr<ProcessGroup>& group = nullptr);
nlohmann::json broadcast_object(const nlohmann::json& object, int src = 0,
                                const std::shared_ptr<ProcessGroup>& group = nullptr);

// Sums (or averages) each value over ranks; every rank receives the result.
// All ranks must pass the same keys; a mismatch is an error naming them.
std::map<std::string, double> reduce_dict(const std::map<std::string, double>& values, bool average = true,
                                          const std::shared_ptr<ProcessGroup>& group = nullptr);

// A seed drawn by rank 0 and shared by all ranks (a fresh random one alone).
int64_t shared_random_seed();

}  // namespace lockstep
