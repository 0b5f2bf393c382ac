// Checkpointer: named checkpoints in a directory, a `last_checkpoint`
// pointer, and resuming from the newest good one.
//
// detectron2's Checkpointer semantics over a Strategy: save() writes
// "<dir>/<name>.ckpt" (on rank 0, atomically) holding the model, optimizer
// and schedulers, the trainer's state (iteration, hook states, data position,
// RNG) and the run's meta, then points `last_checkpoint` at it. resume() goes
// back to the newest checkpoint that verifies; a corrupt or truncated newest
// file is skipped with a warning naming it. The layout is
// checkpoint/checkpoint_layout.h's.
//
// Resuming is one decision, made once (Note [One resume decision]): rank 0
// verifies the candidates, newest first, and broadcasts its choice with the
// seed that checkpoint's run used; every rank then reads that one file, and
// a rank that cannot makes every rank fail, naming it, its rank and why.
//
//   lockstep::Checkpointer checkpointer(strategy, "work_dirs/run", {/*seed=*/42, config.to_yaml()});
//   checkpointer.save("model_0000999", trainer);
//   if (auto contents = checkpointer.resume()) trainer.load_state(*contents->trainer);
//
//   // The same in two steps, when the seed must be known before the model exists:
//   std::optional<lockstep::ResumeChoice> choice = checkpointer.choose_resume();   // collective
//   uint64_t seed = choice && choice->seed ? *choice->seed : fresh_seed;
//   ...
//   if (choice) trainer.load_state(*checkpointer.load(*choice).trainer);           // collective
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/strategy/strategy.h"

namespace lockstep {

class Trainer;

// The checkpoint a resumed run continues from, as rank 0 chose it.
struct ResumeChoice {
  std::string path;
  std::optional<uint64_t> seed;  // the seed of the run that wrote it, when it records one (Note [One resume decision])
};

// What every checkpoint of a run records besides the iteration.
struct CheckpointRunInfo {
  uint64_t seed = 0;
  std::string config;  // the resolved YAML
};

class Checkpointer {
 public:
  using RunInfo = CheckpointRunInfo;

  Checkpointer(std::shared_ptr<Strategy> strategy, std::string save_dir, RunInfo run = RunInfo(),
               CheckpointOptions options = CheckpointOptions());

  // Writes <save_dir>/<name>.ckpt (the strategy's model, optimizer and
  // schedulers, `trainer`'s state, the meta) and updates last_checkpoint.
  // Collective under a distributed strategy. Returns the path.
  std::string save(const std::string& name, const Trainer& trainer);
  // Removes a checkpoint file this checkpointer wrote (rank 0 only).
  void remove(const std::string& path);

  const std::string& save_dir() const { return save_dir_; }
  const RunInfo& run_info() const { return run_; }
  // What later checkpoints record (a runner learns its seed after it chose the checkpoint to resume).
  void set_run_info(RunInfo run) { run_ = std::move(run); }
  std::string path_of(const std::string& name) const { return save_dir_ + "/" + name + ".ckpt"; }
  // The file the pointer names, if the pointer exists.
  std::optional<std::string> last_checkpoint() const;

  // Rank 0 picks the newest checkpoint that verifies (skipping, with a
  // warning, a missing, truncated or corrupt one) and every rank receives
  // the choice; nullopt when there is none. Collective.
  std::optional<ResumeChoice> choose_resume();
  // Every rank loads `choice` (model, optimizer and scheduler state) and
  // returns its contents; every rank fails if any cannot. Collective.
  CheckpointContents load(const ResumeChoice& choice);
  // choose_resume() and load(), or nullopt when there is nothing to resume.
  std::optional<CheckpointContents> resume();

  Strategy& strategy() const { return *strategy_; }

 private:
  std::vector<std::string> resume_candidates() const;

  std::shared_ptr<Strategy> strategy_;
  std::string save_dir_;
  RunInfo run_;
  CheckpointOptions options_;
};

}  // namespace lockstep
