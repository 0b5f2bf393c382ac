#include "apps/lockstep/run_command.h"

#include <iostream>
#include <memory>

#include "lockstep/launch/rendezvous_args.h"

namespace lockstep {

int run_command_main(const LaunchOptions& options) {
  try {
    return launch(options);
  } catch (const std::exception& error) {
    std::string message = error.what();
    if (message.rfind("lockstep run:", 0) != 0) message = "lockstep run: " + message;
    std::cerr << message << std::endl;
    return 1;
  }
}

CLI::App* add_run_command(CLI::App& app) {
  auto options = std::make_shared<LaunchOptions>();
  auto* run = app.add_subcommand("run", "Launch N workers of a program with torchrun's environment "
                                        "(lockstep run --nproc-per-node N [options] -- CMD ARGS...)");
  run->add_option_function<int>("--nproc-per-node,--nproc_per_node", [options](int n) { options->nproc_per_node(n); },
                                "Workers on this machine")->default_str("1");
  run->add_option_function<std::string>("--nnodes", [options](const std::string& n) { apply_nnodes(n, *options); },
                                        "Machines in the job: N, or MIN:MAX for an elastic job")->default_str("1");
  run->add_option_function<int>("--node-rank,--node_rank", [options](int n) { options->node_rank(n); },
                                "This machine's index")->default_str("0");
  run->add_option_function<std::string>("--master-addr,--master_addr",
                                        [options](const std::string& a) { options->master_addr(a); },
                                        "Host of node 0 (runs the rendezvous store)")->default_str("127.0.0.1");
  run->add_option_function<int>("--master-port,--master_port", [options](int p) { options->master_port(p); },
                                "Port of the rendezvous store on node 0")->default_str("29500");
  run->add_flag_function("--standalone", [options](int64_t n) { options->standalone(n > 0); },
                         "One machine: loopback and a free port");
  run->add_option_function<int>("--max-restarts,--max_restarts", [options](int n) { options->max_restarts(n); },
                                "Restart all workers up to K times after a failure")->default_str("0");
  run->add_option_function<double>("--join-timeout,--join_timeout", [options](double s) { options->join_timeout(s); },
                                   "Seconds a node waits for the other nodes to join a restart")->default_str("600");
  run->add_option_function<double>("--signal-grace,--signal_grace", [options](double s) { options->signal_grace(s); },
                                   "Seconds the workers get to save and exit after a forwarded SIGTERM, SIGINT or "
                                   "SIGHUP before they are killed")->default_str("60");
  run->add_option_function<double>("--monitor-interval,--monitor_interval",
                                   [options](double s) { options->monitor_interval(s); },
                                   "Seconds between worker state checks")->default_str("0.1");
  run->add_option_function<double>("--last-call-timeout,--last_call_timeout",
                                   [options](double s) { options->last_call_timeout(s); },
                                   "Elastic jobs: seconds a rendezvous round waits for more nodes once MIN "
                                   "have joined")->default_str("30");
  run->add_option_function<std::string>("--rdzv-endpoint,--rdzv_endpoint",
                                        [options](const std::string& e) { apply_rdzv_endpoint(e, *options); },
                                        "torchrun's HOST[:PORT] of the rendezvous (same as --master-addr/--master-port); "
                                        "etcd: HOST:PORT,HOST:PORT,... of its members");
  run->add_option_function<std::string>("--rdzv-conf,--rdzv_conf",
                                        [options](const std::string& c) { apply_rdzv_conf(c, *options); },
                                        "torchrun's rendezvous settings: last_call_timeout=S,join_timeout=S; etcd: "
                                        "lease_ttl=S,protocol=https,cacert=F,cert=F,key=F,user=NAME");
  run->add_option_function<std::string>("--rdzv-backend,--rdzv_backend",
                                        [options](const std::string& backend) {
                                          if (backend != "c10d" && backend != "static" && backend != "etcd") {
                                            throw CLI::ValidationError("--rdzv-backend",
                                                                       "c10d, static or etcd (got '" + backend + "')");
                                          }
                                          options->rdzv_backend(backend);
                                        },
                                        "Rendezvous backend: c10d (the store of the launcher at --rdzv-endpoint), "
                                        "static, or etcd (an etcd cluster, v3 API: no node is special)");
  run->add_option_function<std::string>("--local-addr,--local_addr",
                                        [options](const std::string& addr) { options->local_addr(addr); },
                                        "etcd rendezvous: the address other nodes reach this one at (default: the "
                                        "one it reaches etcd from)");
  run->add_option_function<std::string>("--run-id,--run_id,--rdzv-id,--rdzv_id", [options](const std::string& id) { options->run_id(id); },
                                        "TORCHELASTIC_RUN_ID for the workers (default: random)");
  run->add_option_function<std::string>(
      "--job-token,--job_token", [options](const std::string& token) { options->job_token(token); },
      "Secret shared by every node of a multi-node job (default: $LOCKSTEP_JOB_TOKEN, which is safer: "
      "a command line is visible to every user; one node: random)");
  run->add_option_function<std::string>(
      "--socket-ifname,--socket_ifname", [options](const std::string& name) { options->socket_ifname(name); },
      "Network interface(s) for the workers' Gloo transport, comma separated (sets GLOO_SOCKET_IFNAME; "
      "default: the interface that routes to --master-addr)");
  run->add_flag_function("--no-prefix", [options](int64_t n) { options->prefix_output(n == 0); },
                         "Do not prefix worker output lines with [rank<R>]:");
  // CLI11 hands everything after "--" to the positional, options included.
  auto command = std::make_shared<std::vector<std::string>>();
  run->add_option("command", *command, "The program and its arguments, after --")->required();
  run->callback([options, command]() {
    options->command(*command);
    int code = run_command_main(*options);
    if (code != 0) throw CLI::RuntimeError(code);
  });
  return run;
}

}  // namespace lockstep
