#include "tests/support/test_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace lockstep::testing {

std::string python() {
  const char* chosen = std::getenv("LOCKSTEP_TEST_PYTHON");
  return chosen != nullptr && *chosen != '\0' ? chosen : "/usr/bin/python3";
}

// Debian's torch 2.x is built without libuv, and its torchrun asks every
// store for libuv whatever USE_LIBUV says, stopping before it starts a
// worker; the shim makes its stores default to the other backend. It also
// binds torchrun to 127.0.0.1 (--local-addr), since the machine's host name
// may not resolve. torch 1.13 runs unchanged. Debian bookworm's torchrun
// (torch 1.13 on Python 3.11) crashes parsing its default --redirects/--tee
// "0" (Python 3.11 no longer iterates IntFlag's zero member); explicit
// non-zero values avoid the bug and keep the output.
std::vector<std::string> torchrun() {
  static const char* const kShim = R"PY(
import runpy, sys
import torch
import torch.distributed as dist
if int(torch.__version__.split(".")[0]) >= 2:
    class TCPStore(dist.TCPStore):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)
    dist.TCPStore = TCPStore
    sys.argv[1:1] = ["--local-addr", "127.0.0.1"]
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
)PY";
  return {python(), "-c", kShim, "--redirects", "1", "--tee", "1"};
}

bool python_has(const std::string& module) {
  static std::mutex mutex;
  static std::map<std::string, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(module);
  if (found == known.end()) {
    found = known.emplace(module, run_command({python(), "-c", "import " + module}, {}, 120).exit_code == 0)
                .first;
  }
  return found->second;
}

std::string python_torch_lacks(const std::string& probe, const std::string& lacking) {
  if (!python_has("torch")) return python() + " has no torch";
  static std::mutex mutex;
  static std::map<std::string, bool> passed;  // by probe: a test asks once per case
  std::lock_guard<std::mutex> lock(mutex);
  auto found = passed.find(probe);
  if (found == passed.end()) found = passed.emplace(probe, run_command({python(), "-c", probe}, {}, 120).exit_code == 0).first;
  return found->second ? std::string() : python() + "'s torch " + lacking;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "<no error>";
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "lockstep_test_XXXXXX").string();
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = buffer.data();
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

CommandResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                          double timeout_s) {
  CommandResult result;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    for (const auto& entry : extra_env) putenv(strdup(entry.c_str()));
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s failed: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipe_fds[1]);
  bool timed_out = false;
  char buffer[4096];
  while (true) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > timeout_s) {
      timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd descriptor{pipe_fds[0], POLLIN, 0};
    int ready = poll(&descriptor, 1, 200);
    if (ready > 0) {
      ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer));
      if (n <= 0) break;
      result.output.append(buffer, static_cast<size_t>(n));
    }
  }
  // Drain whatever is left without blocking forever.
  fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
  ssize_t n;
  while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) result.output.append(buffer, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  // Reap anything the child left in its process group.
  kill(-pid, SIGKILL);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (timed_out) {
    result.exit_code = 124;
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  return result;
}

std::string source_dir() { return LOCKSTEP_SOURCE_DIR; }
std::string binary_dir() { return LOCKSTEP_BINARY_DIR; }
std::string lockstep_binary() { return binary_dir() + "/bin/lockstep"; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

CommandResult export_checkpoint(const std::string& checkpoint, const std::string& out,
                                const std::vector<std::string>& args) {
  std::vector<std::string> argv{lockstep_binary(), "ckpt", "export", checkpoint, "-o", out};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, {}, 120);
}

double number_after(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  if (at == std::string::npos) return std::numeric_limits<double>::quiet_NaN();
  return std::strtod(text.c_str() + at + marker.size(), nullptr);
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << content;
}

bool file_exists(const std::string& path) { return std::filesystem::exists(path); }

}  // namespace lockstep::testing
