// The `preemption` section of a run: which signals stop it to be started
// again, how long it may take to save, and whether it requeues itself under
// SLURM (PyTorch Lightning's SLURMEnvironment(auto_requeue=True)).
//
//   preemption:
//     signals: [SIGTERM, SIGUSR1]   # the default; [] turns preemption off
//     grace_s: 120                  # after the first signal, exit at the latest this much later
//     check_interval: 10            # the ranks vote on a signal every this many iterations
//     auto_requeue: true            # under SLURM: rank 0 runs `scontrol requeue $SLURM_JOB_ID`
//
// On the first of the signals every rank finishes its iteration, the ranks
// agree on the iteration to stop after, save a checkpoint there and exit with
// kExitRequeue (75); `resume: true` (or SLURM's requeue, or a restart by
// `lockstep run`) continues from it bitwise. A second signal, or grace_s
// running out, ends the process at once (core/stop_signals.h).
//
//   PreemptionSettings settings = parse_preemption(config.child("preemption"));
//   if (!settings.signals.empty()) signals.emplace(settings.signals, settings.grace_s);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/config/config.h"

namespace lockstep {

struct PreemptionSettings {
  std::vector<int> signals;
  double grace_s = 120;
  int64_t check_interval = 10;
  bool auto_requeue = false;
};

// A null section gives the defaults.
PreemptionSettings parse_preemption(const Config& section);

// `scontrol requeue $SLURM_JOB_ID`: the job goes back to the queue and runs
// its batch script again (with SLURM_RESTART_COUNT + 1). Returns what
// happened, for the log; never throws (the checkpoint is already saved).
std::string requeue_slurm_job();

}  // namespace lockstep
