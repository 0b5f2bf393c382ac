// GradientSync: the seam through which DDP and FSDP synchronise gradients.
//
// The OptimWrapper owns the training step's control flow (forward context,
// backward, accumulation, clipping, step); a parallel wrapper attaches itself
// to it and is told, at each point, what is about to happen. No wrapper copies
// the model's train_step: the model stays the author of its step.
//
//   class MyDataParallel : public lockstep::GradientSync { ... };
//   optim_wrapper.set_gradient_sync(my_ddp);   // done by the strategy
//
// Call order inside one micro-step of `update_params(loss)`:
//   begin_forward(sync)      -- from optim_context(), before the forward pass
//   begin_backward(loss, sync, iteration)
//   loss.backward()          -- autograd hooks fire, buckets launch
//   end_backward(sync)       -- all reductions finished, .grad holds the result
//   after_step()             -- after the optimizer step, when the window closes
//   step_failed(...)         -- instead of the rest, when this rank's step throws
// `sync` is false on accumulation micro-steps that must not communicate.
#pragma once

#include <exception>

#include <torch/types.h>

#include "lockstep/core/state.h"

namespace lockstep {

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // A forward pass is about to run. `sync`: whether this micro-step's
  // gradients will be reduced. Called only when the model runs under
  // OptimWrapper::optim_context().
  virtual void begin_forward(bool sync) = 0;
  // loss.backward() is about to run (unused-parameter search starts from
  // `loss`). `iteration` is the trainer's iteration (every rank reduces the
  // gradients of the same iteration together; a mismatch means a rank skipped
  // a step), or the wrapper's own count of backward passes without a trainer.
  // DDP: Note [The iteration check]; FSDP: Note [FSDP's step check].
  virtual void begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration) = 0;
  // loss.backward() has returned.
  virtual void end_backward(bool sync) = 0;
  // Turns the norm of this process's gradients (a 0-dim tensor) into the norm
  // of all of them: FSDP shards gradients and combines the shards' norms as
  // PyTorch's FSDP clip_grad_norm_ does (sum of norm^p, then the p-th root;
  // max for the infinity norm). DDP's gradients are already identical on
  // every rank, so the default returns `local` unchanged.
  virtual torch::Tensor reduce_grad_norm(const torch::Tensor& local, double /*norm_type*/) { return local; }
  // Whether the local norm is taken one gradient at a time whatever
  // clip_grad's foreach says: PyTorch's FSDP clip_grad_norm_ takes one
  // linalg.vector_norm per shard and one mul_ per gradient, never
  // torch.nn.utils.clip_grad_norm_'s foreach path. DDP's clip is that
  // function's, so the default is false.
  virtual bool clips_one_gradient_at_a_time() const { return false; }
  // Whether every rank holds each parameter's whole gradient (DDP), so that
  // a parameter's norm needs no reduction; FSDP's are sharded.
  virtual bool holds_whole_gradients() const { return true; }
  // Whether `local` is true on any rank that holds part of, or a replica of,
  // these gradients: `local` is a float32 [1] tensor, nonzero for true, and
  // so is the answer, on the same device and never read on the host (on GPUs
  // the agreement costs no host sync). The loss scaler (amp/grad_scaler.h)
  // asks it whether some rank found an inf/NaN gradient, so every rank skips
  // the same steps and keeps the same scale. A collective where it
  // communicates: every rank calls it once per update, at the same point. The
  // default is right for one process; a wrapper whose ranks can disagree after
  // end_backward (sharded gradients, or gradients touched after the
  // reduction) reduces it with MAX.
  virtual torch::Tensor any_rank_true(const torch::Tensor& local) { return local; }
  // The optimizer has stepped (FSDP re-gathers the parameters it keeps
  // unsharded from the updated shards).
  virtual void after_step() {}
  // This rank's step failed with `error` (an exception in forward, backward,
  // clipping, the optimizer step...), which the caller rethrows unless this
  // throws instead. `reduced`: this step's synchronised backward completed
  // before the failure. `sync` and `iteration` as begin_backward's. Called at
  // most once per failed step, from the optim wrapper. A wrapper that can keep
  // the ranks together drops the step on every rank and throws the error all
  // of them throw (DDP: Note [Dropping a failed step]); one that cannot throws
  // an error saying so, and refuses later steps (FSDP). Default: nothing to do.
  virtual void step_failed(const std::exception_ptr& error, bool reduced, bool sync, int64_t iteration) {}
  // What a resumed run needs to continue bitwise (DDP: the order its buckets
  // were rebuilt in, which fixes the order gradients are summed in; see
  // Note [Bucket order and rebuild]). Saved and loaded with the optim wrapper
  // that drives this sync; every rank loads the same state.
  virtual State state() const { return State(); }
  virtual void load_state(const State& /*state*/) {}
};

}  // namespace lockstep
