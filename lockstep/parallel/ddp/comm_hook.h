// Communication hooks: how DDP reduces one bucket of gradients.
//
// A hook receives a bucket holding this rank's gradients already divided by
// the world size, starts reducing it across the group, and returns a handle
// whose wait() leaves the SUM over ranks (that is, the average gradient) in
// the bucket. Dividing before reducing keeps low-precision sums in range.
//
// Built in: "allreduce" (the default), "fp16_compress" and "bf16_compress"
// (reduce in half precision: half the bytes, a little precision).
// Register your own:
//
//   class MyHook : public lockstep::CommHook {
//    public:
//     std::unique_ptr<lockstep::PendingReduction> launch(lockstep::ProcessGroup& group,
//                                                        torch::Tensor bucket, size_t index) override;
//   };
//   ddp.register_comm_hook(std::make_shared<MyHook>());
//   // or by name from a config: model_wrapper: {type: ..., comm_hook: my_hook}
//   LOCKSTEP_REGISTER(lockstep::comm_hook_registry(), "my_hook",
//                     [](const lockstep::Config&) { return std::make_shared<MyHook>(); });
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <torch/types.h>

#include "lockstep/config/registry.h"

namespace lockstep {

class ProcessGroup;
class Work;

// A reduction in flight. wait() blocks (bounded by the group's timeout), then
// runs the hook's completion step (e.g. decompressing into the bucket).
class PendingReduction {
 public:
  PendingReduction(std::shared_ptr<Work> work, std::function<void()> on_complete = nullptr);
  void wait();

 private:
  std::shared_ptr<Work> work_;
  std::function<void()> on_complete_;
  bool done_ = false;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::unique_ptr<PendingReduction> launch(ProcessGroup& group, torch::Tensor bucket, size_t index) = 0;
  virtual std::string name() const = 0;
};

// all_reduce(SUM) of the bucket as it is.
class AllReduceHook : public CommHook {
 public:
  std::unique_ptr<PendingReduction> launch(ProcessGroup& group, torch::Tensor bucket, size_t index) override;
  std::string name() const override { return "allreduce"; }
};

// Casts the bucket to `dtype` (float16 or bfloat16), sums that across ranks,
// and casts back into the bucket.
class CompressHook : public CommHook {
 public:
  explicit CompressHook(c10::ScalarType dtype);
  std::unique_ptr<PendingReduction> launch(ProcessGroup& group, torch::Tensor bucket, size_t index) override;
  std::string name() const override;

 private:
  c10::ScalarType dtype_;
};

Registry<CommHook>& comm_hook_registry();

}  // namespace lockstep
