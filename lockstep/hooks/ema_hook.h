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
// Under FSDP the weights a rank holds are its shards, and so is its average:
// each rank averages the shards its optimizer steps, and swapping them in
// makes the next gather assemble the averaged model. Its checkpoint state is
// the full averaged model by parameter name (gathered through the
// strategy's full state dict, written by rank 0) and is sharded again on
// resume, as the model's own weights are.
#pragma once

#include <functional>
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
  // What the hook averages, by name: by default the model's parameters.
  using Sources = std::function<std::map<std::string, torch::Tensor>()>;
  // Turns the hook's averaged tensors into checkpoint state and back, for
  // sources that are not the model's own parameters (FSDP's shards).
  struct StateCodec {
    std::function<State(const std::map<std::string, torch::Tensor>& average)> save;
    std::function<void(const State& state, std::map<std::string, torch::Tensor>& average)> load;
  };
  explicit EMAHook(EMAOptions options = EMAOptions(), Sources parameters = nullptr, StateCodec codec = {});

  void before_train() override;
  void after_step() override;
  void before_val_epoch() override { swap(); }
  void after_val_epoch(const std::map<std::string, double>&) override { swap(); }
  void before_test_epoch() override { swap(); }
  void after_test_epoch(const std::map<std::string, double>&) override { swap(); }

  bool stateful() const override { return true; }
  State state() const override;
  void load_state(const State& state) override;

  // Called after each swap of the average and the weights (FSDP refreshes
  // what it keeps gathered).
  void set_after_swap(std::function<void()> after_swap) { after_swap_ = std::move(after_swap); }

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
  Sources parameters_;
  StateCodec codec_;
  std::function<void()> after_swap_;
  std::map<std::string, torch::Tensor> average_;
  int64_t steps_ = 0;
  bool swapped_ = false;
};

}  // namespace lockstep
