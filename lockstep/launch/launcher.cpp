// Worker supervision for lockstep::launch (see launcher.h).
#include "lockstep/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <random>

#include "lockstep/compat/c10d.h"
#include "lockstep/core/error.h"
#include "lockstep/core/open_files.h"
#include "lockstep/core/status_line.h"
#include "lockstep/core/stop_signals.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/job_identity.h"
#include "lockstep/comm/network.h"
#include "lockstep/launch/internal/launcher_output.h"
#include "lockstep/launch/line_prefixer.h"
#include "lockstep/launch/internal/restart_policy.h"
#include "lockstep/launch/internal/signal_scope.h"
#include "lockstep/launch/internal/spawn_worker.h"

namespace lockstep {

namespace {

using Clock = std::chrono::steady_clock;

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_exit(int code) {
  if (code > 128) return str_cat("was killed by signal ", code - 128, " (", strsignal(code - 128), ")");
  return str_cat("exited with code ", code);
}

std::string random_run_id() {
  std::random_device device;
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%08x%08x", device(), device());
  return buffer;
}

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;
  int fds[2] = {-1, -1};  // stdout, stderr read ends
  std::unique_ptr<LinePrefixer> prefixers[2];
};

class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, int master_port, std::string run_id, const std::string& job_token,
             bool hosts_store)
      : options_(options),
        master_port_(master_port),
        run_id_(std::move(run_id)),
        base_env_(current_environment()),
        policy_(make_restart_policy(options, master_port, run_id_, job_token, hosts_store)) {
    if (!job_token.empty()) base_env_["LOCKSTEP_JOB_TOKEN"] = job_token;
  }

  // Start, supervise, and start again where the policy says, until the
  // workers succeed, the restarts run out, or a signal arrives (Note [One
  // supervisor loop] in restart_policy.cpp).
  int run() {
    const int nproc = options_.nproc_per_node();
    if (nproc > 1 && (base_env_.count("OMP_NUM_THREADS") == 0 || base_env_["OMP_NUM_THREADS"].empty())) {
      say("setting OMP_NUM_THREADS=1 for each worker (set it yourself to tune)");
    }
    const auto interrupted = [this] { return this->interrupted(); };
    std::optional<NodePlacement> placement = policy_->next_start(nullptr, /*failed=*/false, interrupted);
    while (placement) {
      policy_->watch(*placement);
      stopped_for_another_node_ = false;
      start_workers(*placement);
      const int code = supervise();
      StatusLine::for_stderr().clear();  // the workers are gone, and a failed rank 0 never cleared its bar
      if (code == 0 && requeue_) return requeue_exit();
      if (signal_ != 0) return 128 + signal_;
      if (code == 0 && !stopped_for_another_node_) {
        policy_->finished();
        return 0;
      }
      const bool failed = !stopped_for_another_node_;
      if (policy_->counts_as_restart(failed) && placement->restart_count >= options_.max_restarts()) {
        if (options_.max_restarts() > 0) say(str_cat("no restarts left (", options_.max_restarts(), " used)"));
        policy_->give_up(*placement);
        return code;
      }
      placement = policy_->next_start(&*placement, failed, interrupted);
    }
    return signal_ != 0 ? 128 + signal_ : 0;  // interrupted, or the job finished while this node waited
  }

 private:
  void start_workers(const NodePlacement& placement) {
    workers_.clear();
    workers_.resize(static_cast<size_t>(options_.nproc_per_node()));
    for (int local = 0; local < options_.nproc_per_node(); ++local) {
      Worker& w = workers_[static_cast<size_t>(local)];
      w.local_rank = local;
      w.rank = placement.node_rank * options_.nproc_per_node() + local;
      auto env = build_worker_env(options_, placement, local, master_port_, run_id_, base_env_);
      // Note [One status line for a whole job]
      // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
      // The workers' stderr is a pipe to this launcher, so none of them can
      // draw a progress bar; the launcher's own stderr may be a terminal.
      // Then the workers send their status lines as records
      // (core/status_line.h), which the launcher draws on its terminal while
      // it prints every worker's lines above them; only rank 0's hook sends
      // any. Without a terminal here nothing is asked: the output is the same
      // lines, byte for byte, as without a progress bar.
      if (StatusLine::for_stderr().mode() == StatusLine::Mode::kTerminal) env["LOCKSTEP_STATUS_TO"] = "launcher";
      spawn(w, env);
    }
  }

  void spawn(Worker& w, const Environment& env) {
    int out[2], err[2];
    LOCKSTEP_CHECK(pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0, "lockstep run: pipe: ",
                   std::strerror(errno));
    // Everything the child needs is built before it starts: it runs only
    // system calls (lockstep/launch/internal/spawn_worker.h).
    std::vector<std::string> env_lines;
    for (const auto& [key, value] : env) env_lines.push_back(key + "=" + value);
    std::vector<char*> envp, argv;
    for (auto& line : env_lines) envp.push_back(line.data());
    envp.push_back(nullptr);
    std::vector<std::string> command = options_.command();
    for (auto& arg : command) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const std::string exec_error = "lockstep run: cannot execute '" + command[0] + "': ";
    // The child starts with the launcher's signal handlers, which write into
    // the launcher's signal pipe: a SIGTERM sent to a worker that has not yet
    // reset them (a peer failed in the same millisecond) would read as the
    // launcher's own. So they stay blocked until the child has its defaults.
    sigset_t handled;
    sigemptyset(&handled);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE, SIGUSR1, SIGUSR2}) sigaddset(&handled, s);
    // The limit this launcher started with (Note [Raising the open-file limit]).
    const std::optional<rlimit> open_files = open_file_limit_at_start();
    const SpawnedWorker child =
        spawn_worker(argv.data(), envp.data(), out[1], err[1], handled, open_files ? &*open_files : nullptr);
    if (child.pid < 0) {
      const int reason = errno;
      for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
      LOCKSTEP_FAIL("lockstep run: cannot start a worker process: ", std::strerror(reason));
    }
    if (child.exec_errno != 0) {
      // The child exits with 127; its reason reaches the log like its output would.
      write_all(err[1], exec_error + std::strerror(child.exec_errno) + "\n");
    }
    const pid_t pid = child.pid;
    close(out[1]);
    close(err[1]);
    w.pid = pid;
    w.running = true;
    w.fds[0] = out[0];
    w.fds[1] = err[0];
    for (int stream = 0; stream < 2; ++stream) {
      fcntl(w.fds[stream], F_SETFL, O_NONBLOCK);
      int target = stream == 0 ? STDOUT_FILENO : STDERR_FILENO;
      std::string prefix = options_.prefix_output() ? str_cat("[rank", w.rank, "]: ") : "";
      w.prefixers[stream] = std::make_unique<LinePrefixer>(prefix, [target, prefix](const std::string& line) {
        StatusLine& status = StatusLine::for_stderr();
        if (auto text = parse_status_record(line, prefix.size())) {
          text->empty() ? status.clear() : status.show(*text);
          return;
        }
        status.write_above([&] { write_all(target, line); });
      });
    }
  }

  // Runs until every worker has ended; returns 0 or the first failure's code.
  int supervise() {
    int failure_code = 0;
    bool stopping = false;
    Clock::time_point kill_at{};
    Clock::time_point drain_until{};
    bool all_ended_seen = false;
    const auto interval = std::chrono::milliseconds(static_cast<long long>(options_.monitor_interval() * 1000));
    while (true) {
      std::vector<pollfd> fds{{SignalScope::read_fd(), POLLIN, 0}};
      for (auto& w : workers_) {
        for (int fd : w.fds) {
          if (fd >= 0) fds.push_back({fd, POLLIN, 0});
        }
      }
      poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(interval.count(), 1)));
      handle_signals(stopping, kill_at);
      drain_output();
      const std::string restart = stopping ? "" : policy_->stop_reason();
      if (!restart.empty()) {
        // Another node waits for this one in the next round.
        say(restart + "; stopping this node's workers");
        stopped_for_another_node_ = true;
        failure_code = 1;
        stopping = true;
        kill_at = Clock::now() + grace();
        signal_all(SIGTERM);
      }
      for (auto& w : workers_) {
        if (!w.running) continue;
        int status = 0;
        if (waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
        w.running = false;
        w.exit_code = decode_status(status);
        kill(-w.pid, SIGKILL);  // whatever the worker left in its process group
        if (w.exit_code == kExitRequeue && failure_code == 0) {
          // Note [A worker that asks to be started again]: it saved and
          // stopped for a preemption, as every rank of its job does at the
          // same iteration; not a failure to restart from, and the others
          // get the time to finish saving. (Workers this launcher stopped
          // itself, for a failure or the next rendezvous round, exit so too:
          // that stop goes on as it began.)
          requeue_ = true;
          if (!stopping) {
            stopping = true;
            kill_at = Clock::now() + signal_grace();
          }
          continue;
        }
        if (w.exit_code != 0 && failure_code == 0 && !stopping) {
          failure_code = w.exit_code;
          say(str_cat("worker rank ", w.rank, " (pid ", w.pid, ") ", describe_exit(w.exit_code),
                      "; stopping all workers"));
          stopping = true;
          kill_at = Clock::now() + grace();
          signal_all(SIGTERM);
        } else if (w.exit_code != 0 && failure_code == 0 && signal_ != 0) {
          failure_code = w.exit_code;
        }
      }
      if (stopping && Clock::now() >= kill_at) signal_all(SIGKILL);
      bool any_running = false;
      for (auto& w : workers_) any_running |= w.running;
      if (!any_running) {
        if (!all_ended_seen) {
          all_ended_seen = true;
          // Output still in the pipes gets a moment; an escaped grandchild
          // holding a pipe open does not get to keep the launcher alive.
          drain_until = Clock::now() + std::chrono::seconds(1);
        }
        if (!any_open() || Clock::now() >= drain_until) {
          close_all();
          return failure_code;
        }
      }
    }
  }

  std::chrono::milliseconds grace() const {
    return std::chrono::milliseconds(static_cast<long long>(options_.kill_grace() * 1000));
  }
  std::chrono::milliseconds signal_grace() const {
    return std::chrono::milliseconds(static_cast<long long>(options_.signal_grace() * 1000));
  }

  int requeue_exit() {
    say(str_cat("the workers saved and stopped to be started again; exiting with ", kExitRequeue));
    return kExitRequeue;
  }

  void handle_signals(bool& stopping, Clock::time_point& kill_at) {
    unsigned char byte;
    while (read(SignalScope::read_fd(), &byte, 1) == 1) {
      int s = byte;
      if (s == SIGCHLD) continue;
      const bool warning = s == SIGUSR1 || s == SIGUSR2;
      say(str_cat("received ", strsignal(s), "; forwarding it to the workers"));
      if (warning) {
        signal_all(s);
        continue;
      }
      // A second stop signal is forwarded too: the workers end at once.
      if (signal_ == 0) signal_ = s;
      signal_all(s);
      if (!stopping) {
        stopping = true;
        kill_at = Clock::now() + signal_grace();
      }
    }
  }

  // Between restarts: whether SIGINT/SIGTERM/SIGHUP arrived (recorded in signal_).
  bool interrupted() {
    unsigned char byte;
    while (read(SignalScope::read_fd(), &byte, 1) == 1) {
      if (byte != SIGCHLD && byte != SIGUSR1 && byte != SIGUSR2 && signal_ == 0) {
        signal_ = byte;
        say(str_cat("received ", strsignal(byte), " while waiting for the other nodes; stopping"));
      }
    }
    return signal_ != 0;
  }

  void signal_all(int s) {
    for (auto& w : workers_) {
      if (w.running) kill(-w.pid, s);
    }
  }

  void drain_output() {
    char buffer[65536];
    for (auto& w : workers_) {
      for (int stream = 0; stream < 2; ++stream) {
        int& fd = w.fds[stream];
        while (fd >= 0) {
          ssize_t n = read(fd, buffer, sizeof(buffer));
          if (n > 0) {
            w.prefixers[stream]->feed(buffer, static_cast<size_t>(n));
          } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            w.prefixers[stream]->flush();
            close(fd);
            fd = -1;
          } else {
            break;
          }
        }
      }
    }
  }

  bool any_open() const {
    for (const auto& w : workers_) {
      if (w.fds[0] >= 0 || w.fds[1] >= 0) return true;
    }
    return false;
  }

  void close_all() {
    for (auto& w : workers_) {
      for (int stream = 0; stream < 2; ++stream) {
        if (w.fds[stream] >= 0) {
          w.prefixers[stream]->flush();
          close(w.fds[stream]);
          w.fds[stream] = -1;
        }
      }
    }
  }

  const LaunchOptions& options_;
  int master_port_;
  std::string run_id_;
  Environment base_env_;
  std::vector<Worker> workers_;
  int signal_ = 0;
  bool requeue_ = false;  // a worker exited with kExitRequeue
  std::unique_ptr<RestartPolicy> policy_;
  bool stopped_for_another_node_ = false;  // the last supervise() stopped healthy workers for the policy
};

}  // namespace

namespace {

// Room for this launcher's pipes (two per worker) and, where it hosts the
// job's store, for every worker's and launcher's connections to it (Note
// [Raising the open-file limit] in core/open_files.cpp).
void make_room_for_workers(const LaunchOptions& options, bool hosts_store) {
  const int nodes = options.standalone() ? 1 : options.nnodes();
  const long ranks = static_cast<long>(options.nproc_per_node()) * nodes;
  const long pipes = 2L * options.nproc_per_node();
  const long store_connections = compat::tcp_store_connections_per_client() * (hosts_store ? ranks + nodes : 1);
  const std::string what = str_cat("starting ", options.nproc_per_node(), " workers",
                                   hosts_store ? str_cat(" and hosting the store of a job of ", ranks, " ranks") : "");
  const OpenFilesRoom room = make_room_for_open_files(pipes + store_connections, "lockstep run", what);
  if (room.raised()) say(room.describe());
}

// --rdzv-backend etcd: no launcher hosts anything for the whole job; each
// round's node 0 hosts that round's store (lockstep/launch/etcd_rendezvous.h).
int launch_on_etcd(LaunchOptions options, const std::string& token) {
  LOCKSTEP_CHECK(!options.standalone(), "lockstep run: --standalone is one machine; --rdzv-backend etcd is for several");
  LOCKSTEP_CHECK(!token.empty(), "lockstep run: --rdzv-backend etcd needs a job token shared by every node: set "
                 "LOCKSTEP_JOB_TOKEN (or pass --job-token) to the same secret on every node");
  LOCKSTEP_CHECK(!options.run_id().empty(), "lockstep run: --rdzv-backend etcd needs --rdzv-id, the job's name on etcd "
                 "(the same on every node, a new one for each job)");
  LOCKSTEP_CHECK(!options.etcd().endpoints.empty(), "lockstep run: --rdzv-backend etcd needs --rdzv-endpoint "
                 "HOST:PORT[,HOST:PORT...] (etcd's client URLs)");
  if (!options.etcd().user.empty() && options.etcd().password.empty()) {
    const char* password = std::getenv("LOCKSTEP_ETCD_PASSWORD");
    LOCKSTEP_CHECK(password != nullptr, "lockstep run: --rdzv-conf user=", options.etcd().user,
                   " needs the password in LOCKSTEP_ETCD_PASSWORD");
    options.etcd().password = password;
  }
  if (!options.elastic()) options.min_nodes(options.nnodes());  // --nnodes N: a job of exactly N nodes
  // Each round's node 0 hosts that round's store.
  make_room_for_workers(options, /*hosts_store=*/true);
  SignalScope signals;
  Supervisor supervisor(options, /*master_port=*/0, options.run_id(), token, /*hosts_store=*/false);
  return supervisor.run();
}

// --job-token, else LOCKSTEP_JOB_TOKEN; empty when neither is given.
std::string given_job_token(const LaunchOptions& options) {
  if (!options.job_token().empty()) return options.job_token();
  const char* from_env = std::getenv("LOCKSTEP_JOB_TOKEN");
  return from_env != nullptr ? from_env : "";
}

// A job without a token: one launcher makes a random one; launchers on one
// machine go on without (and say so); a job across machines is refused.
std::string settle_job_token(const LaunchOptions& options, std::string token) {
  if (!token.empty()) return token;
  const bool one_launcher = options.standalone() || (options.nnodes() == 1 && !options.elastic());
  // Several launchers meeting on 127.0.0.1 are one machine (a test topology):
  // nodes elsewhere could not reach that address.
  const bool one_machine = one_launcher || is_loopback_host(options.master_addr());
  LOCKSTEP_CHECK(one_machine, "lockstep run: a job on ", options.nnodes(), " nodes needs a job token shared by "
                 "every node, so that no other process can join it: set LOCKSTEP_JOB_TOKEN (or pass --job-token) "
                 "to the same secret on every node (e.g. the output of `openssl rand -hex 16`)");
  if (one_launcher) return random_job_token();
  if (options.node_rank() == 0 || options.elastic()) {
    say("no job token: any process on this machine can join the job; set LOCKSTEP_JOB_TOKEN on every launcher "
        "to prevent that");
  }
  return token;
}

// Hosts the job's store at host:port (port 0: the OS picks it, and `port`
// becomes the bound one). Null where an elastic job's store is hosted by
// another launcher on this machine, which bound the port first.
c10::intrusive_ptr<compat::C10dStore> host_job_store(const LaunchOptions& options, const std::string& host,
                                                     int& port) {
  compat::TcpStoreSpec spec;
  spec.host = host;
  spec.port = port;
  spec.is_server = true;
  spec.num_workers = options.nproc_per_node() * (options.standalone() ? 1 : options.nnodes());
  try {
    auto [server, bound] = compat::make_tcp_store(spec);
    port = bound;
    return server;
  } catch (const std::exception& error) {
    // Another launcher of the elastic job on this machine hosts it.
    if (!options.elastic()) {
      LOCKSTEP_FAIL("lockstep run: cannot host the rendezvous store on port ", port, ": ",
                    short_torch_message(error), " (is another job using it? choose another --master-port)");
    }
    return {};
  }
}

// Checks that this node belongs to the job before starting any worker, and
// takes the job's run id when none was given.
void join_job_store(const LaunchOptions& options, const std::string& host, int port, const std::string& token,
                    std::string& run_id) {
  compat::TcpStoreSpec spec;
  spec.host = host;
  spec.port = port;
  spec.timeout = default_timeout();
  c10::intrusive_ptr<compat::C10dStore> client;
  try {
    client = compat::make_tcp_store(spec).first;
  } catch (const std::exception& error) {
    LOCKSTEP_FAIL("lockstep run: cannot reach node 0's rendezvous store at ", host, ":", port, ": ",
                  short_torch_message(error));
  }
  try {
    join_job(client, JobIdentity{run_id, token}, spec.timeout, str_cat(host, ":", port), &run_id);
  } catch (const Error& error) {
    LOCKSTEP_FAIL("lockstep run: node ", options.node_rank(), " ", error.what());
  }
}

}  // namespace

int launch(const LaunchOptions& options) {
  validate_launch_options(options);
  std::string token = given_job_token(options);
  if (options.rdzv_backend() == "etcd") return launch_on_etcd(options, token);
  token = settle_job_token(options, std::move(token));
  // An elastic job's store is hosted by the launcher on the machine at
  // master_addr (the first one there to bind the port), as torchrun's c10d
  // rendezvous does; a fixed job's by node 0.
  bool hosts_store = options.standalone() ||
                     (options.elastic() ? is_local_host(options.master_addr()) &&
                                              !accepts_connections(options.master_addr(), options.master_port())
                                        : options.node_rank() == 0);
  std::string host = options.standalone() ? "127.0.0.1" : options.master_addr();
  int port = options.standalone() ? 0 : options.master_port();
  // Node 0 hosts the job's store for the whole run (restarts included), as
  // torchrun's agent does; in standalone mode the OS picks a free port.
  make_room_for_workers(options, hosts_store);
  c10::intrusive_ptr<compat::C10dStore> store;
  if (hosts_store) {
    store = host_job_store(options, host, port);
    hosts_store = static_cast<bool>(store);
  }
  std::string run_id = options.run_id();
  if (hosts_store) {
    if (run_id.empty()) run_id = random_run_id();
    if (!token.empty()) publish_job(store, JobIdentity{run_id, token});
  } else if (!token.empty()) {
    join_job_store(options, host, port, token, run_id);
  }
  SignalScope signals;
  Supervisor supervisor(options, port, run_id, token, hosts_store);
  return supervisor.run();
}

}  // namespace lockstep
