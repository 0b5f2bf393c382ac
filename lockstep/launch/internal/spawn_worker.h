// Starts one worker process for the launcher: a new process group, default
// signal handlers, stdout and stderr on the given pipes, killed when the
// launcher dies, nothing else of the launcher's open files, and the
// open-file limit the launcher started with (Note [Raising the open-file
// limit] in core/open_files.cpp).
//
//   sigset_t handled = ...;   // the signals the launcher handles itself
//   std::optional<rlimit> limit = open_file_limit_at_start();
//   SpawnedWorker child = spawn_worker(argv.data(), envp.data(), out_pipe[1], err_pipe[1], handled,
//                                      limit ? &*limit : nullptr);
//   if (child.exec_errno != 0) ...  // the command could not be executed; it
//                                   // exits with 127, the reason is in exec_errno
//
// Note [Starting workers without copying the launcher]: `lockstep run` has
// libtorch mapped, and fork() copies the page tables of every mapping: about
// 7 ms per worker here, where Python's subprocess (torchrun) takes 2 ms. With
// 64 workers starting on 2 cores, each fork also waits behind the workers
// already loading, so the last one started 4.7 s later than under torchrun.
// spawn_worker clones with CLONE_VM | CLONE_VFORK instead, as glibc's
// posix_spawn does: the child borrows the launcher's memory until it execs,
// so the cost no longer depends on the launcher's size. posix_spawn itself
// cannot set PR_SET_PDEATHSIG, which the workers need. The child runs only
// system calls on a stack of its own; the launcher's thread waits until it
// has exec'd (or failed to).
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>

namespace lockstep {

struct SpawnedWorker {
  pid_t pid = -1;     // -1: the process could not be created (errno says why)
  int exec_errno = 0; // not 0: the process exists, could not exec, and exits with 127
};

// `handled` are the signals the launcher has handlers for: the caller's
// thread blocks them around the clone, and the child resets them to their
// default action before it unblocks them (a SIGTERM for a worker that has not
// exec'd yet must not run the launcher's handler). `open_files`, unless null,
// is set as the child's RLIMIT_NOFILE.
SpawnedWorker spawn_worker(char* const argv[], char* const envp[], int stdout_fd, int stderr_fd,
                           const sigset_t& handled, const rlimit* open_files);

}  // namespace lockstep
