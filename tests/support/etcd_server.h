// A real etcd for tests: one member (Debian's etcd-server) listening on
// loopback ports of its own, its data in a temporary directory; killed and
// removed when the object goes.
//
//   if (auto why = lockstep::testing::EtcdServer::missing(); !why.empty()) GTEST_SKIP() << why;
//   lockstep::testing::EtcdServer etcd;                    // plain http
//   EtcdClient client({{etcd.endpoint()}});
//   lockstep::testing::EtcdServer secure(EtcdServer::Tls{certs + "/ca.pem", certs + "/server.pem",
//                                                        certs + "/server.key"});  // https, client certificates
//   etcd.etcdctl("user add root --new-user-password=pw");
//   etcd.kill();                                           // SIGKILL, as a machine that dies
//   lockstep::testing::EtcdServer cluster(std::nullopt, 3);  // three members
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <c10/macros/Macros.h>

namespace lockstep::testing {

class EtcdServer {
 public:
  struct Tls {
    std::string ca, cert, key;  // --trusted-ca-file, --cert-file, --key-file; clients must show a certificate
  };

  // Why no etcd can run here ("" when it can).
  static std::string missing() {
    if (std::system("command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1") != 0) {
      return "no etcd and etcdctl (Debian packages etcd-server, etcd-client; scripts/install-deps.sh installs them)";
    }
    return "";
  }

  // `members` > 1: a cluster of that many members, each with its own ports.
  explicit EtcdServer(std::optional<Tls> tls = std::nullopt, int members = 1) : tls_(std::move(tls)) {
    char pattern[] = "/tmp/lockstep_etcd_XXXXXX";
    dir_ = mkdtemp(pattern);
    const std::string scheme = tls_ ? "https" : "http";
    std::vector<int> peer_ports;
    std::string cluster;
    for (int m = 0; m < members; ++m) {
      client_ports_.push_back(free_port());
      peer_ports.push_back(free_port());
      cluster += (m ? "," : "") + member_name(m) + "=http://127.0.0.1:" + std::to_string(peer_ports.back());
    }
    for (int m = 0; m < members; ++m) {
      const std::string client_url = scheme + "://127.0.0.1:" + std::to_string(client_ports_[m]);
      const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_ports[m]);
      std::vector<std::string> args{"etcd", "--name", member_name(m), "--data-dir", dir_ + "/" + member_name(m),
                                    "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                                    "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                                    "--initial-cluster", cluster};
      if (tls_) {
        for (const auto& extra : {std::vector<std::string>{"--trusted-ca-file", tls_->ca},
                                  {"--cert-file", tls_->cert}, {"--key-file", tls_->key}, {"--client-cert-auth"}}) {
          args.insert(args.end(), extra.begin(), extra.end());
        }
      }
      const std::string out = dir_ + "/" + member_name(m) + ".out";
      const pid_t pid = fork();
      if (pid == 0) {
        std::vector<char*> argv;
        for (auto& arg : args) argv.push_back(arg.data());
        argv.push_back(nullptr);
        std::freopen(out.c_str(), "w", stdout);
        std::freopen(out.c_str(), "a", stderr);
        execvp("etcd", argv.data());
        _exit(127);
      }
      pids_.push_back(pid);
    }
    // Ready once `etcdctl endpoint health` says so for every member (the port opens before a member can serve).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      for (pid_t pid : pids_) {
        if (waitpid(pid, nullptr, WNOHANG) == pid) {
          kill();
          throw std::runtime_error("an etcd member exited at start (see " + dir_ + "/*.out)");
        }
      }
      if (etcdctl("--dial-timeout=1s --command-timeout=2s endpoint health >/dev/null 2>&1")) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill();
    throw std::runtime_error("etcd did not start within 20 s (see " + dir_ + "/*.out)");
  }

  ~EtcdServer() {
    kill();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  C10_DISABLE_COPY_AND_ASSIGN(EtcdServer);

  // "127.0.0.1:PORT" (members: comma separated), as --rdzv-endpoint takes it.
  std::string endpoint() const {
    std::string list;
    for (int port : client_ports_) list += (list.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(port);
    return list;
  }
  // The first member's URL.
  std::string url() const {
    return std::string(tls_ ? "https://" : "http://") + "127.0.0.1:" + std::to_string(client_ports_.front());
  }

  // Runs `etcdctl ARGS` against this member (as the server's own client
  // certificate under TLS); true when it exits 0.
  bool etcdctl(const std::string& args) const {
    std::string urls;
    for (int port : client_ports_) {
      urls += (urls.empty() ? "" : ",") + std::string(tls_ ? "https://" : "http://") + "127.0.0.1:" + std::to_string(port);
    }
    std::string command = "ETCDCTL_API=3 etcdctl --endpoints=" + urls;
    if (tls_) command += " --cacert=" + tls_->ca + " --cert=" + tls_->cert + " --key=" + tls_->key;
    return std::system((command + " " + args).c_str()) == 0;
  }

  void kill() {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    pids_.clear();
  }

  // A loopback port nothing listens on (for "unreachable" endpoints too).
  static int free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    socklen_t length = sizeof(address);
    getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    close(fd);
    return ntohs(address.sin_port);
  }

 private:
  static std::string member_name(int m) { return "m" + std::to_string(m); }

  std::optional<Tls> tls_;
  std::string dir_;
  std::vector<int> client_ports_;
  std::vector<pid_t> pids_;
};

}  // namespace lockstep::testing
