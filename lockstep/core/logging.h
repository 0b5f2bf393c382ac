// Logging: one spdlog logger for the library, aware of the process's rank.
//
//   lockstep::logger().info("Starting training from iteration {}", start);
//   lockstep::set_log_rank(rank, world_size);   // called by distributed init
//   lockstep::add_log_file(work_dir + "/log_rank1.txt");
//
// On rank 0 the console shows info and above; other ranks show warnings and
// errors only (their full log can go to a file), as detectron2 does.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace lockstep {

spdlog::logger& logger();
void set_log_rank(int rank, int world_size);
// Also writes everything (debug and above) to `path`.
void add_log_file(const std::string& path);
// Stops writing to (and closes) a file add_log_file opened; nothing if none.
void remove_log_file(const std::string& path);
// The rank set by set_log_rank (0 before distributed initialisation).
int log_rank();

}  // namespace lockstep
