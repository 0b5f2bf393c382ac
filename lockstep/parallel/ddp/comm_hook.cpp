#include "lockstep/parallel/ddp/comm_hook.h"

#include "lockstep/core/error.h"
#include "lockstep/dist/process_group.h"

namespace lockstep {

PendingReduction::PendingReduction(std::shared_ptr<Work> work, std::function<void()> on_complete)
    : work_(std::move(work)), on_complete_(std::move(on_complete)) {}

void PendingReduction::wait() {
  if (done_) return;
  if (work_) work_->wait();
  if (on_complete_) on_complete_();
  done_ = true;
}

std::unique_ptr<PendingReduction> AllReduceHook::launch(ProcessGroup& group, torch::Tensor bucket, size_t /*index*/) {
  return std::make_unique<PendingReduction>(group.all_reduce(bucket, ReduceOp::kSum, /*async=*/true));
}

CompressHook::CompressHook(c10::ScalarType dtype) : dtype_(dtype) {
  LOCKSTEP_CHECK(dtype == torch::kHalf || dtype == torch::kBFloat16,
                 "a compression hook reduces in float16 or bfloat16, not ", c10::toString(dtype));
}

std::string CompressHook::name() const { return dtype_ == torch::kHalf ? "fp16_compress" : "bf16_compress"; }

std::unique_ptr<PendingReduction> CompressHook::launch(ProcessGroup& group, torch::Tensor bucket, size_t /*index*/) {
  if (bucket.scalar_type() == dtype_) {
    return std::make_unique<PendingReduction>(group.all_reduce(bucket, ReduceOp::kSum, /*async=*/true));
  }
  auto compressed = std::make_shared<torch::Tensor>(bucket.to(dtype_));
  auto work = group.all_reduce(*compressed, ReduceOp::kSum, /*async=*/true);
  return std::make_unique<PendingReduction>(work, [bucket, compressed]() mutable { bucket.copy_(*compressed); });
}

Registry<CommHook>& comm_hook_registry() {
  static Registry<CommHook> registry("comm hook");
  return registry;
}

LOCKSTEP_REGISTER(comm_hook_registry(), "allreduce", [](const Config&) { return std::make_shared<AllReduceHook>(); });
LOCKSTEP_REGISTER(comm_hook_registry(), "fp16_compress",
                  [](const Config&) { return std::make_shared<CompressHook>(torch::kHalf); });
LOCKSTEP_REGISTER(comm_hook_registry(), "bf16_compress",
                  [](const Config&) { return std::make_shared<CompressHook>(torch::kBFloat16); });

}  // namespace lockstep
