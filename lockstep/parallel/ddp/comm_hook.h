// Communication hooks: how DDP reduces one bucket of gradients, shaped like
// PyTorch's DDP comm hooks (register_comm_hook(state, hook)).
//
// A hook receives a GradBucket: its index, its flat buffer holding this rank's
// gradients as autograd left them (NOT divided by the world size), a view of
// each parameter's gradient into that buffer, the parameters, and whether it
// is the last bucket of the pass. It starts reducing the bucket and returns a
// PendingReduction whose wait() yields the averaged bucket. The hook divides
// by the world size itself, where it suits its arithmetic (before a
// half-precision sum, after a PowerSGD projection; see
// Note [Dividing by the world size] in reducer.cpp). The hook object carries
// its own state (PowerSGD's error feedback and low-rank matrices) and saves
// it into checkpoints through state() / load_state().
//
// Built in, by the names a config uses (model_wrapper.comm_hook):
//   allreduce                 PyTorch's allreduce_hook
//   fp16_compress             fp16_compress_hook: half the bytes, a little precision
//   bf16_compress             bf16_compress_hook
//   PowerSGD                  powerSGD_hook (powersgd_hook.h): low-rank compression
//   BatchedPowerSGD           batched_powerSGD_hook
// Without a hook DDP does what PyTorch's DDP does without one: it divides
// while copying gradients into the bucket and all-reduces the sum.
//
// Hooks run on the thread that runs backward, and wait() runs in DDP's final
// callback, bucket by bucket in order; communication a hook starts from
// either place is issued in the same order on every rank. A wait() may start
// more communication (PowerSGD's second all_reduce does).
//
//   class MyHook : public lockstep::CommHook {
//    public:
//     std::unique_ptr<lockstep::PendingReduction> run(lockstep::ProcessGroup& group,
//                                                     const lockstep::GradBucket& bucket) override {
//       torch::Tensor buffer = bucket.buffer();
//       buffer.div_(group.size());
//       return std::make_unique<lockstep::PendingReduction>(group.all_reduce(buffer, lockstep::ReduceOp::kSum, true));
//     }
//     std::string name() const override { return "my_hook"; }
//   };
//   ddp.register_comm_hook(std::make_shared<MyHook>());
//   // or by name from a config: model_wrapper: {type: ..., comm_hook: {type: my_hook, ...}}
//   LOCKSTEP_REGISTER(lockstep::comm_hook_registry(), "my_hook",
//                     [](const lockstep::Config&) { return std::make_shared<MyHook>(); });
//
// Hooks written before this contract overrode launch(group, bucket, index)
// and received the bucket already divided by the world size. They still work
// unchanged: the default run() divides and calls launch() (and says once in
// the log that the contract changed).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "lockstep/config/registry.h"
#include "lockstep/core/state.h"

namespace lockstep {

class ProcessGroup;
class Work;

// One bucket of DDP's gradients, as a hook sees it (PyTorch's GradBucket).
class GradBucket {
 public:
  GradBucket(size_t index, torch::Tensor buffer, std::vector<torch::Tensor> gradients,
             std::vector<torch::Tensor> parameters, bool is_last);
  size_t index() const { return index_; }
  // The flat buffer: write the reduced result here, or return it from wait().
  const torch::Tensor& buffer() const { return buffer_; }
  // Views into buffer(), shaped like each parameter.
  const std::vector<torch::Tensor>& gradients() const { return gradients_; }
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }
  bool is_last() const { return is_last_; }

 private:
  size_t index_;
  torch::Tensor buffer_;
  std::vector<torch::Tensor> gradients_;
  std::vector<torch::Tensor> parameters_;
  bool is_last_;
};

// A reduction in flight (PyTorch's Future[Tensor]). wait() blocks (each
// collective bounded by its group's timeout) and returns the averaged
// bucket; DDP copies it into the bucket's buffer unless it is that buffer.
class PendingReduction {
 public:
  // Done when `work` is; then `on_complete` runs (e.g. decompressing into the
  // bucket), and wait() returns `result`.
  PendingReduction(std::shared_ptr<Work> work, std::function<void()> on_complete = nullptr,
                   torch::Tensor result = {});
  // A reduction made of several steps: `finish` blocks as long as it needs
  // (it may start and wait for more collectives) and returns the result.
  explicit PendingReduction(std::function<torch::Tensor()> finish);
  // An undefined result means "the bucket's buffer, reduced in place".
  torch::Tensor wait();

 private:
  std::function<torch::Tensor()> finish_;
  torch::Tensor result_;
  bool done_ = false;
  std::exception_ptr error_;  // a failed wait() fails again, without communicating
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  // Starts reducing `bucket` across `group` (DDP's group).
  virtual std::unique_ptr<PendingReduction> run(ProcessGroup& group, const GradBucket& bucket);
  virtual std::string name() const = 0;
  // What a checkpoint keeps of the hook (empty for stateless hooks); loaded
  // back before the first backward of a resumed run.
  virtual State state() const { return {}; }
  virtual void load_state(const State& state);
  // A checkpoint written at another world size: `rank0` is what rank 0
  // saved. Returns false (the default) when the hook starts afresh instead;
  // PowerSGD keeps what all ranks share and restarts its error feedback.
  virtual bool load_state_from_other_world_size(const State& /*rank0*/) { return false; }

  // The contract before run(): `bucket` arrives divided by the world size and
  // the hook leaves the sum over ranks in it. Override run() instead.
  virtual std::unique_ptr<PendingReduction> launch(ProcessGroup& group, torch::Tensor bucket, size_t index);

 private:
  bool told_about_launch_ = false;
};

// PyTorch's allreduce_hook: divide, then all_reduce(SUM).
class AllReduceHook : public CommHook {
 public:
  std::unique_ptr<PendingReduction> run(ProcessGroup& group, const GradBucket& bucket) override;
  std::string name() const override { return "allreduce"; }
};

// PyTorch's fp16_compress_hook / bf16_compress_hook: cast to `dtype`, divide,
// sum across ranks in that dtype, cast back into the bucket.
class CompressHook : public CommHook {
 public:
  explicit CompressHook(c10::ScalarType dtype);
  std::unique_ptr<PendingReduction> run(ProcessGroup& group, const GradBucket& bucket) override;
  std::string name() const override;

 private:
  c10::ScalarType dtype_;
};

// Divides `buffer` by the group's size in place and starts summing it across
// the group: PyTorch's _allreduce_fut, the plain reduction hooks build on.
std::unique_ptr<PendingReduction> all_reduce_average(ProcessGroup& group, torch::Tensor buffer);

Registry<CommHook>& comm_hook_registry();

// A hook from a config value: a name ("fp16_compress") or a map with `type`
// and the hook's options ({type: PowerSGD, matrix_approximation_rank: 4}).
// Errors name the config key.
std::shared_ptr<CommHook> make_comm_hook(const Config& spec);

}  // namespace lockstep
