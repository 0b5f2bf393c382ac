// EarlyStoppingHook: stops training when a validation metric stops improving.
//
// mmengine's EarlyStoppingHook, after every validation pass:
//   - a non-finite value stops at once (check_finite);
//   - a value beyond stopping_threshold (by `rule`) stops at once;
//   - a value not better than best + min_delta (by `rule`) counts one
//     patience step, and `patience` of them in a row stop;
//   - otherwise it is the new best and the count restarts.
// Every rank stops at the same iteration: a stop any rank decides is every
// rank's (the ranks see the same gathered metrics, so they decide alike). The
// run then ends like a finished one (final evaluation results, the final
// checkpoint), and its state remembers the stop, so a resumed run does not
// train on.
//
//   custom_hooks:
//     - {type: EarlyStoppingHook, monitor: accuracy/top1, rule: greater, patience: 3, min_delta: 0.001}
//
//   auto hook = std::make_shared<lockstep::EarlyStoppingHook>(
//       lockstep::EarlyStoppingHook::Options{"loss", "less", /*min_delta=*/0.0, /*patience=*/2});
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "lockstep/engine/hook.h"

namespace lockstep {

class EarlyStoppingHook : public Hook {
 public:
  struct Options {
    std::string monitor;
    std::string rule = "greater";  // "greater" or "less": which way is better
    double min_delta = 0.1;        // mmengine's default
    int64_t patience = 5;
    std::optional<double> stopping_threshold;
    bool strict = false;       // a missing metric is an error (else a warning)
    bool check_finite = true;  // stop on NaN or infinity
  };
  // `agree` makes a decision of any rank every rank's (identity on one process).
  explicit EarlyStoppingHook(Options options, std::function<bool(bool)> agree = nullptr);

  void before_train() override;
  void after_val_epoch(const std::map<std::string, double>& metrics) override;

  bool may_request_stop() const override { return true; }
  bool stateful() const override { return true; }
  State state() const override;
  void load_state(const State& state) override;

  int64_t wait_count() const { return wait_count_; }
  double best_score() const { return best_score_; }
  bool stopped() const { return stopped_; }

  // mmengine's _init_rule: "greater" for names holding acc, top, AR@, auc,
  // precision, mAP, mDice, mIoU, mAcc or aAcc; "less" for loss; else empty.
  static std::string default_rule(const std::string& monitor);

 private:
  // Whether `score` ends training, and why.
  bool check_stop(double score, std::string* reason);

  Options options_;
  std::function<bool(bool)> agree_;
  int64_t wait_count_ = 0;
  double best_score_;
  bool stopped_ = false;
  std::string stop_reason_;
};

}  // namespace lockstep
