#include "lockstep/launch/internal/spawn_worker.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace lockstep {

namespace {

struct ChildArgs {
  char* const* argv;
  char* const* envp;
  int stdout_fd;
  int stderr_fd;
  pid_t launcher;
  const sigset_t* handled;
  const rlimit* open_files;
  int exec_errno;  // written by the child (shared memory) when exec fails
};

// Runs in the child, on its own stack, in the launcher's memory: system calls
// only (Note [Starting workers without copying the launcher]).
int child_main(void* raw) {
  auto* args = static_cast<ChildArgs*>(raw);
  setpgid(0, 0);
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) {
    if (sigismember(args->handled, s) == 1) sigaction(s, &default_action, nullptr);
  }
  // A launcher killed outright (SIGKILL) takes its workers with it.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != args->launcher) _exit(128 + SIGTERM);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (args->open_files != nullptr) setrlimit(RLIMIT_NOFILE, args->open_files);
  dup2(args->stdout_fd, STDOUT_FILENO);
  dup2(args->stderr_fd, STDERR_FILENO);
#ifdef SYS_close_range
  syscall(SYS_close_range, 3U, ~0U, 0U);
#endif
  execvpe(args->argv[0], args->argv, args->envp);
  args->exec_errno = errno != 0 ? errno : ENOEXEC;
  _exit(127);
}

}  // namespace

SpawnedWorker spawn_worker(char* const argv[], char* const envp[], int stdout_fd, int stderr_fd,
                           const sigset_t& handled, const rlimit* open_files) {
  // execvpe builds each candidate path on the stack (PATH_MAX bytes and the
  // name); 256 KiB is plenty. Freed once the child has exec'd.
  constexpr size_t kStackSize = 256 * 1024;
  void* stack = mmap(nullptr, kStackSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  SpawnedWorker spawned;
  if (stack == MAP_FAILED) return spawned;
  ChildArgs args{argv, envp, stdout_fd, stderr_fd, getpid(), &handled, open_files, 0};
  sigset_t saved_mask;
  pthread_sigmask(SIG_BLOCK, &handled, &saved_mask);
  const pid_t pid = clone(child_main, static_cast<char*>(stack) + kStackSize, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  const int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &saved_mask, nullptr);
  munmap(stack, kStackSize);
  if (pid < 0) {
    errno = clone_errno;
    return spawned;
  }
  setpgid(pid, pid);  // also here, so that killpg works whoever runs first
  spawned.pid = pid;
  spawned.exec_errno = args.exec_errno;
  return spawned;
}

}  // namespace lockstep
