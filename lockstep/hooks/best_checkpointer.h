// BestCheckpointer: after each evaluation, saves "model_best" when the
// watched metric improved (mode "max" or "min"); NaN results are skipped with
// a warning. Register it after the EvalHook. The best value so far is hook
// state, so a resumed run keeps comparing against it.
//
//   auto best = std::make_shared<lockstep::BestCheckpointer>(/*eval_period=*/938, checkpointer,
//                                                            "accuracy/top1", "max");
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "lockstep/engine/checkpointer.h"
#include "lockstep/engine/hook.h"

namespace lockstep {

class BestCheckpointer : public Hook {
 public:
  BestCheckpointer(int64_t eval_period, std::shared_ptr<Checkpointer> checkpointer, std::string metric,
                   std::string mode = "max", std::string file_prefix = "model_best");
  void after_step() override;
  void after_train() override;

  bool stateful() const override { return true; }
  State state() const override;
  void load_state(const State& state) override;
  std::optional<double> best_value() const { return best_value_; }

 private:
  void check_best();
  int64_t eval_period_;
  std::shared_ptr<Checkpointer> checkpointer_;
  std::string metric_;
  bool maximize_;
  std::string file_prefix_;
  std::optional<double> best_value_;
  int64_t best_iter_ = -1;
  int64_t last_checked_iter_ = -1;
};

}  // namespace lockstep
