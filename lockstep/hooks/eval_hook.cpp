#include "lockstep/hooks/eval_hook.h"

#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/model/model.h"

namespace lockstep {

EvalHook::EvalHook(int64_t period, EvalFunction evaluate, std::function<void()> barrier, int64_t iters_per_epoch)
    : Hook("EvalHook"),
      period_(period),
      evaluate_(std::move(evaluate)),
      barrier_(std::move(barrier)),
      iters_per_epoch_(iters_per_epoch) {
  LOCKSTEP_CHECK(evaluate_ != nullptr, "EvalHook needs an evaluation function");
}

void EvalHook::run_evaluation(int64_t completed) {
  Model& model = trainer().model();
  const bool was_training = model.is_training();
  model.eval();
  std::map<std::string, double> results;
  try {
    results = evaluate_();
  } catch (...) {
    if (was_training) model.train();
    throw;
  }
  if (was_training) model.train();
  for (const auto& [name, value] : results) {
    trainer().storage().put_scalar(name, value, /*smoothing_hint=*/false);
  }
  if (iters_per_epoch_ > 0 && !results.empty()) {
    trainer().storage().put_scalar("epoch", static_cast<double>(completed) / static_cast<double>(iters_per_epoch_),
                                   /*smoothing_hint=*/false);
  }
  last_evaluated_ = completed;
  if (barrier_) barrier_();
}

void EvalHook::after_step() {
  const int64_t next = trainer().iter() + 1;
  // The final evaluation belongs to after_train, which knows whether the run completed.
  if (period_ > 0 && next % period_ == 0 && next != trainer().max_iter()) run_evaluation(next);
}

void EvalHook::after_train() {
  // iter() == max_iter only when every iteration ran.
  // The final results are recorded at iteration max_iter, one past the last
  // step, so writers that publish "scalars newer than the last write" see them.
  // A run stopped early was evaluated at its last iteration already.
  if (trainer().iter() >= trainer().max_iter() && last_evaluated_ != trainer().iter()) run_evaluation(trainer().iter());
}

// Every val_interval iterations and at the end; every rank waits for the others afterwards.
LOCKSTEP_REGISTER(hook_registry(), "EvalHook", [](const Config& config, const HookContext& context) {
  LOCKSTEP_CHECK(context.evaluate != nullptr, config.where(), ": EvalHook needs a val_dataloader");
  std::shared_ptr<Collectives> ranks = context.collectives;
  return std::make_shared<EvalHook>(context.val_interval, context.evaluate, [ranks] { ranks->barrier(); },
                                    context.by_epoch ? context.iters_per_epoch : 0);
});

}  // namespace lockstep
