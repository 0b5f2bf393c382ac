#include "lockstep/core/open_files.h"

#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "lockstep/core/error.h"

namespace lockstep {

// Note [Raising the open-file limit]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A rank of an N-rank job holds one socket per peer in Gloo's mesh, and the
// process that hosts the job's store one connection per client (two on
// libtorch 1.13, whose store clients keep a second one for watchKey
// callbacks); a launcher holds two pipes per worker besides. Most Linux
// systems start processes with a soft limit of 1,024 open files (systemd's
// default, kept low for programs that still use select()) under a hard limit
// of 524,288 or more. So a job of about a thousand ranks failed inside Gloo
// ("socket: Too many open files", halfway through the mesh, its peers waiting
// out their timeout), and a launcher hosting the store for a few hundred
// workers aborted: c10d's store thread terminates the process when accept()
// fails. torchrun leaves this to its user; Go's runtime and systemd's advice
// raise the soft limit to the hard one. lockstep does that, and only when
// what it is about to open does not fit, so that small jobs see no change.
// It never lowers a limit and never touches the hard one. Where the hard
// limit is too small the process says so before it opens anything, with the
// numbers and the ways to raise it, and exits.
//
// The count is this process's open descriptors now, plus what the caller is
// about to open, plus kOpenFilesMargin for what nobody counts ahead (the
// user's files, data loaders, libraries). Measured here on libtorch 1.13: a
// rank of a 40-rank job needs 46-50 descriptors, of an 80-rank job 88-90,
// N + 9 either way.
//
// A launcher's children start with the limit the launcher started with, as
// systemd asks of programs that raise it: a program that is not lockstep
// sees what it would under torchrun, and lockstep's workers make their own
// room.

namespace {

std::mutex& limit_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::optional<rlimit>& limit_at_start() {
  static std::optional<rlimit> limit;
  return limit;
}

std::string limit_text(rlim_t limit) { return limit == RLIM_INFINITY ? "unlimited" : std::to_string(limit); }

// "rank 3: " before a message; nothing for a caller that adds its own context.
std::string prefix(const std::string& who) { return who.empty() ? "" : who + ": "; }

}  // namespace

std::string OpenFilesRoom::describe() const {
  return str_cat("raised the open-file limit (RLIMIT_NOFILE) from ", limit_text(soft_before), " to ",
                 limit_text(soft_after), ": ", what, " needs about ", needed);
}

OpenFilesRoom plan_open_files_room(long open, long more, rlim_t soft, rlim_t hard, const std::string& who,
                                   const std::string& what) {
  OpenFilesRoom room;
  room.open = open;
  room.needed = open + std::max(more, 0L) + kOpenFilesMargin;
  room.soft_before = room.soft_after = soft;
  room.hard = hard;
  room.what = what;
  const auto needed = static_cast<rlim_t>(room.needed);
  if (soft == RLIM_INFINITY || soft >= needed) return room;
  LOCKSTEP_CHECK(hard == RLIM_INFINITY || hard >= needed, prefix(who), what, " needs about ", room.needed,
                 " open files (", open, " open now), and this process may open at most ", hard,
                 " (the hard limit of RLIMIT_NOFILE, `ulimit -Hn`): raise it where the job starts (a nofile line in "
                 "/etc/security/limits.conf, LimitNOFILE= in a systemd unit, or `ulimit -Hn` as root) and start again");
  // An unlimited hard limit cannot be a soft one (Linux caps it at
  // fs.nr_open): the count itself then.
  room.soft_after = hard == RLIM_INFINITY ? needed : hard;
  return room;
}

long open_file_count() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  long count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory stream's own descriptor
}

OpenFilesRoom make_room_for_open_files(long more, const std::string& who, const std::string& what) {
  std::lock_guard<std::mutex> lock(limit_mutex());
  rlimit limit{};
  LOCKSTEP_CHECK(getrlimit(RLIMIT_NOFILE, &limit) == 0, prefix(who), "cannot read the open-file limit: ",
                 std::strerror(errno));
  OpenFilesRoom room = plan_open_files_room(open_file_count(), more, limit.rlim_cur, limit.rlim_max, who, what);
  if (!room.raised()) return room;
  rlimit raised = limit;
  raised.rlim_cur = room.soft_after;
  LOCKSTEP_CHECK(setrlimit(RLIMIT_NOFILE, &raised) == 0, prefix(who), what, " needs about ", room.needed,
                 " open files, and raising the soft limit of RLIMIT_NOFILE from ", limit_text(limit.rlim_cur), " to ",
                 limit_text(raised.rlim_cur), " failed: ", std::strerror(errno),
                 "; raise it before starting (`ulimit -n`)");
  if (!limit_at_start()) limit_at_start() = limit;
  return room;
}

std::optional<rlimit> open_file_limit_at_start() {
  std::lock_guard<std::mutex> lock(limit_mutex());
  return limit_at_start();
}

}  // namespace lockstep
