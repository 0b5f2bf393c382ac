// OptimWrapper: one optimizer plus everything around its step.
//
// mmengine's OptimWrapper semantics: gradient accumulation
// (`accumulative_counts`, with the last, shorter window scaled by its real
// length), gradient clipping by norm or value (the norm is logged as
// "grad_norm"), zero_grad after each update. A model's train_step uses it as:
//
//   lockstep::LogVars MyModel::train_step(const Batch& batch, OptimWrapper& optim) {
//     torch::Tensor loss;
//     {
//       auto context = optim.optim_context();   // no_sync / autocast decisions
//       loss = compute_my_loss(data_preprocessor()(batch, true));
//     }
//     optim.update_params(loss);                 // backward, maybe step + zero_grad
//     return {{"loss", loss.item<double>()}};
//   }
//
// Parallel strategies attach a GradientSync (DDP, FSDP); mixed precision
// subclasses it (amp/amp_optim_wrapper.h). OptimWrapperDict holds several named
// wrappers for models with several optimizers (GANs).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/torch.h>

#include "lockstep/core/state.h"
#include "lockstep/core/step_metrics.h"
#include "lockstep/optim/accumulation_window.h"
#include "lockstep/optim/gradient_sync.h"
#include "lockstep/optim/step_progress.h"

namespace lockstep {

class OptimWrapper;
class OptimWrapperDict;

struct ClipGradOptions {
  // kNorm: mmengine's clip_grad, one norm over every gradient;
  // kNormPerParameter: detectron2's CLIP_TYPE "norm", each gradient clipped
  // against its own norm (clip_grad_norm_ called per parameter, in group
  // order); kValue: every element clamped to [-clip_value, clip_value].
  enum class Kind { kNone, kNorm, kNormPerParameter, kValue };
  Kind kind = Kind::kNone;
  double max_norm = 0;     // kNorm, kNormPerParameter
  double norm_type = 2.0;  // kNorm, kNormPerParameter; use INFINITY for the max norm
  double clip_value = 0;   // kValue
  // kNorm: the norms by _foreach_norm and the scaling by one _foreach_mul_,
  // or one norm and one mul_ per gradient; unset, as this libtorch's
  // clip_grad_norm_ does by default (Note [foreach as Python chooses it]).
  // Sharded gradients (FSDP) take one norm per gradient, as PyTorch's FSDP.
  std::optional<bool> foreach;
};

struct OptimWrapperOptions {
  TORCH_ARG(int64_t, accumulative_counts) = 1;
  TORCH_ARG(ClipGradOptions, clip_grad) = {};
};

// The one check of OptimWrapperOptions, for the constructor and the config
// parser alike: throws naming `where(key)` for the first option out of range
// (key "accumulative_counts", "clip_grad.max_norm" or "clip_grad.clip_value").
void check_optim_wrapper_options(const OptimWrapperOptions& options,
                                 const std::function<std::string(const std::string& key)>& where);

// What a trainer's step tells the optim wrapper while the step runs.
struct StepContext {
  // The trainer's iteration: DDP and FSDP check that every rank reduces the
  // same iteration's gradients (Note [The iteration check], Note [FSDP's step check]).
  // -1: the wrapper counts backward passes itself.
  int64_t iteration = -1;
  // Runs after every backward pass, before the optimizer step (the trainer's after_backward hooks).
  std::function<void()> after_backward;
};

// What the trainer needs from "the optimization" of a model, whether it has one
// optimizer or several. Deliberately small: both implementations honour all of it.
class OptimWrapperBase {
 public:
  virtual ~OptimWrapperBase() = default;

  // A step in progress: `context` applies while the scope lives. An optim
  // wrapper serves one step at a time; opening a second is an error (two
  // trainers driving one wrapper at once).
  class StepScope {
   public:
    StepScope(StepScope&& other) noexcept;
    C10_DISABLE_COPY_AND_ASSIGN(StepScope);
    ~StepScope();

   private:
    friend class OptimWrapperBase;
    explicit StepScope(OptimWrapperBase* wrapper) : wrapper_(wrapper) {}
    OptimWrapperBase* wrapper_;
  };
  // `context` must outlive the scope.
  [[nodiscard]] StepScope begin_step(const StepContext& context);

  // The dict behind this wrapper, or null for a single OptimWrapper (Model's
  // run_train_step picks the train_step overload by it).
  virtual OptimWrapperDict* as_dict() { return nullptr; }
  virtual void zero_grad() = 0;
  // Prepares accumulation counting for a run of iterations [start, max).
  virtual void initialize_count_status(int64_t start_iter, int64_t max_iters) = 0;
  // "lr" of the main param group, by wrapper name ("" for a single wrapper).
  virtual std::map<std::string, double> learning_rates() const = 0;
  // Metrics of this step's update (grad_norm, loss_scale; none when the step
  // did not update), prefixed by name for dicts, as device tensors: reading
  // them is left to whoever logs them.
  virtual std::map<std::string, torch::Tensor> last_update_metric_tensors() const = 0;
  // The same read to the host, with one copy.
  LogVars last_update_metrics() const;
  virtual State state() const = 0;
  virtual void load_state(const State& state) = 0;
  // The wrappers inside, by name ("" for a single wrapper).
  virtual std::vector<std::pair<std::string, OptimWrapper*>> wrappers() = 0;
  // The step in progress failed on this rank with `error` (called by
  // Model::run_train_step, or by a program that owns its loop, before it
  // rethrows). Tells each wrapper's GradientSync (GradientSync::step_failed),
  // which may throw the error every rank agrees on instead: with DDP, the step
  // is then dropped on every rank, and every rank can go on.
  virtual void abandon_step(const std::exception_ptr& error) = 0;

 protected:
  // begin_step's two halves; a dict opens and closes every wrapper it holds.
  virtual void open_step(const StepContext* context) = 0;
  virtual void close_step() = 0;
};

class OptimWrapper : public OptimWrapperBase {
 public:
  explicit OptimWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer,
                        OptimWrapperOptions options = OptimWrapperOptions());
  ~OptimWrapper() override;

  // Guard for the forward pass of one micro-step: tells the attached
  // GradientSync whether this micro-step synchronises, and (in subclasses)
  // enables autocast. Keep it alive exactly around the forward pass.
  class Context {
   public:
    Context(Context&&) noexcept;
    C10_DISABLE_COPY_AND_ASSIGN(Context);
    ~Context();

   private:
    friend class OptimWrapper;
    explicit Context(std::function<void()> on_exit);
    std::function<void()> on_exit_;
  };
  [[nodiscard]] Context optim_context();

  // loss / accumulation factor -> backward -> (step + zero_grad when the
  // accumulation window closes). `loss` must be a scalar.
  void update_params(const torch::Tensor& loss);
  // The building blocks of update_params, for models that need finer control.
  torch::Tensor scale_loss(const torch::Tensor& loss) const;
  void backward(const torch::Tensor& loss);
  void step();
  void zero_grad() override;

  // Where this micro-step sits in its accumulation window: whether it
  // synchronises and updates, and what scale_loss divides its loss by.
  const AccumulationWindow& accumulation() const { return accumulation_; }
  int64_t accumulative_counts() const { return options_.accumulative_counts(); }
  // A replayed CUDA graph ran a backward pass (and maybe the step) that this
  // wrapper's host code did not see run (engine/cuda_graph_step.h): counts
  // it as backward() counts one.
  void count_replayed_backward();
  // A replayed CUDA graph rewrites the metric tensors its capture made
  // (last_update_metric_tensors), so its owner puts them back after each replay.
  void set_last_metric_tensors(std::map<std::string, torch::Tensor> tensors) { last_metrics_ = std::move(tensors); }
  // Changes each time load_state() replaces the optimizer's state (whose
  // tensors a captured step must not outlive).
  int64_t state_generation() const { return state_generation_; }
  void initialize_count_status(int64_t start_iter, int64_t max_iters) override;

  torch::optim::Optimizer& optimizer() const { return *optimizer_; }
  std::shared_ptr<torch::optim::Optimizer> optimizer_ptr() const { return optimizer_; }
  std::vector<torch::Tensor> parameters() const;

  // The first iteration whose loss was not finite on this rank, as an int64
  // [1] tensor on the loss's device, -1 while none was; undefined before the
  // first backward. From that iteration on, every rank skips this wrapper's
  // optimizer steps (Note [A non-finite loss stops before the step]); the
  // trainer reads it with the logged values and stops the run.
  const torch::Tensor& nonfinite_loss_iteration() const { return nonfinite_loss_iteration_; }
  // Whether a non-finite loss stops this wrapper's steps for good, as above.
  // The Trainer turns it on: its run ends at the next read of the loss. Off
  // (the default), a loop that owns its steps keeps PyTorch's behaviour: a
  // GradScaler skips the one step whose gradients are not finite, and goes on.
  void stop_stepping_after_nonfinite_loss(bool on) { stop_after_nonfinite_loss_ = on; }

  // Throws when the clip asks what `sync` cannot give (a per-parameter norm
  // of sharded gradients).
  void set_gradient_sync(std::shared_ptr<GradientSync> sync);
  GradientSync* gradient_sync() const { return gradient_sync_.get(); }

  std::map<std::string, double> learning_rates() const override;
  // The tensors the update left, not read: the trainer reads them with the
  // logged losses, in one copy, when it records metrics.
  std::map<std::string, torch::Tensor> last_update_metric_tensors() const override { return last_metrics_; }
  State state() const override;
  void load_state(const State& state) override;
  std::vector<std::pair<std::string, OptimWrapper*>> wrappers() override { return {{"", this}}; }
  void abandon_step(const std::exception_ptr& error) override;

  // Where the step in progress is, for the GradientSync's step_failed
  // (optim/step_progress.h): running, reduced or failed.
  using StepPhase = StepProgress::Phase;
  StepPhase step_phase() const { return progress_.phase(); }

 protected:
  // Mixed-precision seams (amp/amp_optim_wrapper.h overrides them).
  virtual std::function<void()> enter_forward_context() { return nullptr; }
  virtual torch::Tensor scale_for_backward(const torch::Tensor& loss) { return loss; }
  virtual void unscale_gradients() {}
  // Steps the optimizer; returns false if the step was skipped.
  virtual bool optimizer_step();
  // A step that does not update (inside an accumulation window) leaves no
  // metrics: grad_norm is logged at the iterations that clipped, as mmengine
  // records it, not carried over from the last update.
  void open_step(const StepContext* context) override {
    last_metrics_.clear();
    progress_.begin(context);
  }
  void close_step() override { progress_.end(); }
  // This step's update's metrics (grad_norm, loss_scale), one-element tensors
  // on whatever device computed them; empty when the step did not update.
  std::map<std::string, torch::Tensor> last_metrics_;

 private:
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  OptimWrapperOptions options_;
  std::shared_ptr<GradientSync> gradient_sync_;
  AccumulationWindow accumulation_;
  StepProgress progress_;
  int64_t state_generation_ = 0;
  bool forward_context_open_ = false;

  // Note [A non-finite loss stops before the step]
  torch::Tensor guard_nonfinite_loss(const torch::Tensor& loss, const torch::Tensor& to_differentiate,
                                     int64_t iteration);
  torch::Tensor nonfinite_loss_found();
  torch::Tensor nonfinite_loss_iteration_;
  bool stop_after_nonfinite_loss_ = false;
  bool warned_check_after_step_ = false;
};

// Several named OptimWrappers, for models that update several networks in
// turns (a GAN's generator and discriminator). A container, not an optimizer:
// the model picks the wrapper it needs by name.
class OptimWrapperDict : public OptimWrapperBase {
 public:
  OptimWrapperDict() = default;
  void add(const std::string& name, std::shared_ptr<OptimWrapper> wrapper);
  OptimWrapper& operator[](const std::string& name) const;
  bool contains(const std::string& name) const { return wrappers_.count(name) > 0; }
  std::vector<std::string> names() const;

  OptimWrapperDict* as_dict() override { return this; }
  void zero_grad() override;
  void initialize_count_status(int64_t start_iter, int64_t max_iters) override;
  std::map<std::string, double> learning_rates() const override;
  std::map<std::string, torch::Tensor> last_update_metric_tensors() const override;
  State state() const override;
  void load_state(const State& state) override;
  std::vector<std::pair<std::string, OptimWrapper*>> wrappers() override;
  // Every wrapper is told, in name order, even after one threw; the first
  // error thrown (the agreed one) is rethrown once all were told.
  void abandon_step(const std::exception_ptr& error) override;

 protected:
  void open_step(const StepContext* context) override;
  void close_step() override;

 private:
  std::map<std::string, std::shared_ptr<OptimWrapper>> wrappers_;
  std::vector<StepScope> open_steps_;  // one per wrapper while a step runs
};

}  // namespace lockstep
