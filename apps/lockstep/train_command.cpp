#include "apps/lockstep/train_command.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/core/stop_signals.h"
#include "lockstep/runner/runner.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep::cli {
namespace {

struct TrainArguments {
  std::string config;
  std::string work_dir;
  std::string load_from;
  std::vector<std::string> overrides;
  bool resume = false;
  bool no_test = false;
  int nproc = 0;
};

int run_train(const TrainArguments& args) {
  Config config = load_config(args.config);
  for (const auto& assignment : args.overrides) config.apply_override(assignment);
  Runner runner(config, RunnerOptions().work_dir(args.work_dir).resume(args.resume).load_from(args.load_from));
  auto val_metrics = runner.train();
  if (runner.preempted()) return kExitRequeue;  // saved; the test set waits for the finished run
  std::map<std::string, double> test_metrics;
  if (!args.no_test && config.has("test_dataloader")) test_metrics = runner.test();
  if (runner.strategy().collectives()->is_main_process()) {
    const auto& final_metrics = test_metrics.empty() ? val_metrics : test_metrics;
    const char* split = test_metrics.empty() ? "val" : "test";
    for (const auto& [name, value] : final_metrics) {
      std::cout << "Final " << split << " " << name << ": " << value << std::endl;
    }
    // Where to look next: the run's files, and its curves without TensorBoard.
    const std::string& dir = runner.work_dir();
    const bool final_checkpoint = std::filesystem::exists(dir + "/model_final.ckpt");
    std::cout << "Checkpoints" << (final_checkpoint ? " (" + dir + "/model_final.ckpt)" : std::string())
              << ", metrics.jsonl and log.txt are in " << dir << "; draw the curves with: lockstep plot " << dir
              << std::endl;
  }
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArguments>();
  CLI::App* train = app.add_subcommand("train", "Train from a YAML config (one process, or --nproc N on this machine)");
  train->add_option("config", args->config, "YAML config file")->required()->check(CLI::ExistingFile);
  train->add_option("--work-dir", args->work_dir, "Directory for checkpoints, logs and metrics (default: config's work_dir)");
  train->add_flag("--resume", args->resume, "Resume from the work dir's last good checkpoint");
  train->add_option("--load-from", args->load_from, "Start from the weights of this checkpoint");
  train->add_option("--set", args->overrides, "Override a config value: --set optimizer.lr=0.05 (repeatable)")
      ->take_all();
  train->add_flag("--no-test", args->no_test, "Skip the final test-set evaluation");
  train->add_option("--nproc", args->nproc,
                    "Run N processes on this machine (short for: lockstep run --standalone --nproc-per-node N -- "
                    "lockstep train ...)");
  train->callback([args, &app]() {
    if (args->nproc > 1) {
      // Re-run this command under the launcher, without --nproc.
      std::vector<std::string> argv{"/proc/self/exe", "run", "--standalone", "--nproc-per-node",
                                    std::to_string(args->nproc), "--", "/proc/self/exe", "train", args->config};
      if (!args->work_dir.empty()) argv.insert(argv.end(), {"--work-dir", args->work_dir});
      if (args->resume) argv.push_back("--resume");
      if (!args->load_from.empty()) argv.insert(argv.end(), {"--load-from", args->load_from});
      if (args->no_test) argv.push_back("--no-test");
      for (const auto& assignment : args->overrides) argv.insert(argv.end(), {"--set", assignment});
      char exe[4096];
      ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
      if (n > 0) {
        exe[n] = '\0';
        argv[0] = argv[6] = exe;
      }
      std::vector<char*> raw;
      for (auto& arg : argv) raw.push_back(arg.data());
      raw.push_back(nullptr);
      execv(raw[0], raw.data());
      throw std::runtime_error("cannot re-execute lockstep under the launcher");
    }
    throw CLI::RuntimeError(run_train(*args));
  });
}

}  // namespace lockstep::cli
