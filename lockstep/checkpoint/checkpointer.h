// Checkpointer: named checkpoints in a directory, a `last_checkpoint`
// pointer, and resuming from the newest good one.
//
// detectron2's Checkpointer semantics over a Strategy: save() writes
// "<dir>/<name>.ckpt" (on rank 0, atomically) holding the model, optimizer,
// schedulers and whatever the extra-state provider returns (the trainer's
// iteration, hook states, data position, RNG), then points `last_checkpoint`
// at it. resume() goes back to the newest checkpoint that verifies; a corrupt
// or truncated newest file is skipped with a warning naming it.
//
//   lockstep::Checkpointer checkpointer(strategy, "work_dirs/run");
//   checkpointer.set_extra_state([&] { return trainer_state(); });
//   checkpointer.save("model_0000999");
//   if (auto state = checkpointer.resume()) trainer.load_state(state->get("trainer"));
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/core/state.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {

class Checkpointer {
 public:
  Checkpointer(std::shared_ptr<Strategy> strategy, std::string save_dir,
               CheckpointOptions options = CheckpointOptions());

  void set_extra_state(std::function<State()> provider) { extra_state_ = std::move(provider); }
  // Writes <save_dir>/<name>.ckpt and updates last_checkpoint. Returns the path.
  std::string save(const std::string& name);
  // Removes a checkpoint file this checkpointer wrote (rank 0 only).
  void remove(const std::string& path);

  const std::string& save_dir() const { return save_dir_; }
  std::string path_of(const std::string& name) const { return save_dir_ + "/" + name + ".ckpt"; }
  // The file the pointer names, if the pointer exists.
  std::optional<std::string> last_checkpoint() const;

  // Loads the newest checkpoint that verifies, with optimizer and scheduler
  // state; nullopt when there is none.
  std::optional<State> resume();
  // Loads weights only (load_from): strict=false reports mismatches as warnings.
  State load_weights(const std::string& path, bool strict);

  Strategy& strategy() const { return *strategy_; }

 private:
  std::vector<std::string> resume_candidates() const;

  std::shared_ptr<Strategy> strategy_;
  std::string save_dir_;
  CheckpointOptions options_;
  std::function<State()> extra_state_;
};

}  // namespace lockstep
