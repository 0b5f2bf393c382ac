#include "lockstep/runner/preemption.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"
#include "lockstep/core/stop_signals.h"

extern char** environ;

namespace lockstep {

PreemptionSettings parse_preemption(const Config& section) {
  PreemptionSettings settings;
  if (section.is_null()) {
    settings.signals = {SIGTERM, SIGUSR1};
    return settings;
  }
  LOCKSTEP_CHECK(section.is_map(), section.where(), ": preemption is a map: {signals: [SIGTERM, SIGUSR1], grace_s: "
                 "120, check_interval: 10, auto_requeue: false}");
  const auto names = section.get<std::vector<std::string>>("signals", {"SIGTERM", "SIGUSR1"});
  for (size_t i = 0; i < names.size(); ++i) {
    settings.signals.push_back(parse_signal(names[i], section.where("signals") + "[" + std::to_string(i) + "]"));
  }
  settings.grace_s = section.get<double>("grace_s", settings.grace_s);
  LOCKSTEP_CHECK(std::isfinite(settings.grace_s) && settings.grace_s >= 0, section.where("grace_s"),
                 ": grace_s must be >= 0 seconds (0: no limit), got ", settings.grace_s);
  settings.check_interval = section.get<int64_t>("check_interval", settings.check_interval);
  LOCKSTEP_CHECK(settings.check_interval >= 1, section.where("check_interval"),
                 ": check_interval must be at least 1 iteration, got ", settings.check_interval);
  settings.auto_requeue = section.get<bool>("auto_requeue", false);
  check_all_used(section, "preemption");
  return settings;
}

std::string requeue_slurm_job() {
  const char* job = std::getenv("SLURM_JOB_ID");
  if (job == nullptr || *job == '\0') {
    return "auto_requeue: not a SLURM job (no SLURM_JOB_ID); whoever started it must start it again";
  }
  std::string job_id = job;
  std::vector<std::string> args{"scontrol", "requeue", job_id};
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, "scontrol", nullptr, nullptr, argv.data(), environ);
  if (spawned != 0) return str_cat("auto_requeue: cannot run scontrol: ", std::strerror(spawned));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return str_cat("auto_requeue: waiting for scontrol: ", std::strerror(errno));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "requeued SLURM job " + job_id + " (scontrol requeue)";
  return str_cat("auto_requeue: `scontrol requeue ", job_id, "` failed (status ", status,
                 "); is the job requeueable (sbatch --requeue, JobRequeue=1)?");
}

}  // namespace lockstep
