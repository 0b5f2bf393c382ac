// open_files: room for the sockets and pipes a large job opens, before it
// opens them (Note [Raising the open-file limit]).
//
//   // a rank about to connect to its 999 peers
//   OpenFilesRoom room = lockstep::make_room_for_open_files(999, "rank 3", "a Gloo mesh of 1000 ranks");
//   if (room.raised()) logger().info("rank 3: {}", room.describe());
//
// It counts the descriptors this process has open (/proc/self/fd), adds
// `more` and kOpenFilesMargin, and when RLIMIT_NOFILE's soft limit is below
// that sum raises it to the hard limit. When the hard limit is below the sum
// too, it throws lockstep::Error naming `who` (when not empty: a caller that
// adds its own context leaves it so), `what`, the numbers and how to raise
// the hard limit, before any socket fails halfway through a mesh.
//
// A launcher gives its children the limit it started with
// (open_file_limit_at_start()), as systemd asks of programs that raise it.
#pragma once

#include <sys/resource.h>

#include <optional>
#include <string>

namespace lockstep {

// Descriptors left over for what lockstep cannot count ahead: the user's
// files, a data loader's, libraries' own.
constexpr long kOpenFilesMargin = 64;

struct OpenFilesRoom {
  long open = 0;            // descriptors open when asked
  long needed = 0;          // open + more + kOpenFilesMargin
  rlim_t soft_before = 0;   // RLIMIT_NOFILE's soft limit when asked
  rlim_t soft_after = 0;    // ... and after
  rlim_t hard = 0;
  std::string what;         // what needs them, for messages
  bool raised() const { return soft_after != soft_before; }
  // "raised the open-file limit (RLIMIT_NOFILE) from 1024 to 524288: <what> needs about 1100"
  std::string describe() const;
};

// The decision alone, for any numbers: the soft limit to set (soft_after),
// or lockstep::Error when even `hard` is below open + more + margin.
OpenFilesRoom plan_open_files_room(long open, long more, rlim_t soft, rlim_t hard, const std::string& who,
                                   const std::string& what);

// Counts, decides and sets (setrlimit) for this process.
OpenFilesRoom make_room_for_open_files(long more, const std::string& who, const std::string& what);

// This process's RLIMIT_NOFILE before make_room_for_open_files first raised
// it; nullopt when it never did.
std::optional<rlimit> open_file_limit_at_start();

// The descriptors this process has open now.
long open_file_count();

}  // namespace lockstep
