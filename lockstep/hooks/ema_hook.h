// EMAHook: an exponential moving average of the model's weights, used for
// validation and testing.
//
// mmengine's EMAHook with its ExponentialMovingAverage, term by term. After
// each optimizer step (after_step):
//   - before begin_iter (iteration + 1 < begin_iter) the average is a copy of
//     the weights;
//   - from then on it is updated every `interval` updates: the first update
//     copies, the later ones move it by ema += momentum * (weight - ema), in
//     the weight's dtype (torch's lerp_);
//   - buffers (BatchNorm statistics) are averaged too with update_buffers,
//     else copied from the model.
// Validation and test passes swap the average in (before_val_epoch) and back
// (after_val_epoch). The average and its step count are the hook's state:
// saved with every checkpoint and resumed bitwise.
//
//   custom_hooks:
//     - {type: EMAHook, momentum: 0.0002, interval: 1, begin_iter: 0, update_buffers: false}
//
// Under FSDP the weights a rank holds are its shards, and so is its average;
// the checkpoints of such a run hold only rank 0's, so FSDP is refused until
// the hook's state is sharded like the optimizer's.
#pragma once

#include <map>
#include <string>

#include <torch/types.h>

#include "lockstep/engine/hook.h"

namespace lockstep {

struct EMAOptions {
  TORCH_ARG(double, momentum) = 0.0002;
  TORCH_ARG(int64_t, interval) = 1;
  TORCH_ARG(int64_t, begin_iter) = 0;
  TORCH_ARG(bool, update_buffers) = false;
};

class EMAHook : public Hook {
 public:
  explicit EMAHook(EMAOptions options = EMAOptions());

  void before_train() override;
  void after_step() override;
  void before_val_epoch() override { swap(); }
  void after_val_epoch(const std::map<std::string, double>&) override { swap(); }
  void before_test_epoch() override { swap(); }
  void after_test_epoch(const std::map<std::string, double>&) override { swap(); }

  bool stateful() const override { return true; }
  State state() const override;
  void load_state(const State& state) override;

  // The averaged tensors by the model's parameter and buffer names.
  const std::map<std::string, torch::Tensor>& average() const { return average_; }
  int64_t steps() const { return steps_; }

 private:
  // The model's tensors this hook averages (parameters, and buffers) or copies (buffers).
  std::map<std::string, torch::Tensor> averaged_sources() const;
  std::map<std::string, torch::Tensor> copied_sources() const;
  void ensure_average();
  void copy_from_model();
  void update();
  // Exchanges the model's weights with the average.
  void swap();

  EMAOptions options_;
  std::map<std::string, torch::Tensor> average_;
  int64_t steps_ = 0;
  bool swapped_ = false;
};

}  // namespace lockstep
