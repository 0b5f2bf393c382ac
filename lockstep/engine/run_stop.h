// RunStop: where a training run ends, and how its ranks agree on an early end.
//
// A run ends at its max_iter, or earlier when a hook asks (an early stop) or
// the job is being preempted (a scheduler's signal, hooks/preemption_hook.h).
// In a distributed run every rank must stop after the same iteration: after
// each iteration (and after before_train) the ranks vote whether any of them
// asked, which they do when a registered hook declares may_request_stop(); a
// request without such a hook is an error, since the other ranks would train
// on alone. A preemption is a vote too (Note [Stopping for a preemption]), and
// preempted() is then true on every rank, so that hooks save a checkpoint to
// resume from instead of a final one. Each trainer has one (Trainer::stop()).
//
//   class StopAtLoss : public lockstep::Hook {
//    public:
//     StopAtLoss() : Hook("StopAtLoss") {}
//     void after_step() override {
//       auto& storage = trainer().storage();
//       if (storage.has("loss") && storage.history("loss").latest() < 0.01) trainer().stop().request("loss < 0.01");
//     }
//     bool may_request_stop() const override { return true; }
//   };
//   trainer.stop().set_agreement([ranks](bool local) { return ranks->any_rank(local); });
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lockstep {

class Trainer;

class RunStop {
 public:
  explicit RunStop(const Trainer& trainer) : trainer_(trainer) {}

  // Ends the run after the current iteration (before the first, when asked
  // from before_train). Hooks then see a finished run: the trainer's iter()
  // reaches max_iter().
  void request(const std::string& reason);
  // A stop because the job is being preempted. On the run's last iteration
  // it is ignored: the run finishes.
  void request_preemption(const std::string& reason);
  bool preempted() const { return preempted_; }
  bool stopped_early() const { return stopped_early_; }
  // How ranks agree on a stop: true when `local` is true on any rank
  // (Collectives::any_rank). Unset: one process, nothing to agree.
  void set_agreement(std::function<bool(bool)> any_rank) { agreement_ = std::move(any_rank); }

  // For the trainer. A run that ends at `max_iter` begins; the ranks vote as
  // often as the hooks that may request a stop need (`vote_intervals`: empty,
  // none may).
  void begin(int64_t max_iter, std::vector<int64_t> vote_intervals);
  // The iteration the run ends at, as far as it is decided.
  int64_t max_iter() const { return max_iter_; }
  // After before_train and after each iteration: whether any rank asked.
  void vote();
  // The caller ends its run at `iteration`: an early end when before max_iter().
  void end_at(int64_t iteration);

 private:
  // The last iteration that runs if the run stopped now.
  int64_t last_iteration() const;
  void stop_for_preemption(const std::string& reason);

  const Trainer& trainer_;
  std::function<bool(bool)> agreement_;
  int64_t max_iter_ = 0;
  bool stopped_early_ = false;
  bool votes_ = false;                   // a registered hook may request a stop
  std::vector<int64_t> vote_intervals_;  // of the hooks that may request a stop
  bool stop_requested_here_ = false;     // this rank asked since the last vote
  bool preemption_requested_here_ = false;
  bool preempted_ = false;
};

}  // namespace lockstep
