#include "lockstep/parallel/ddp/comm_hook.h"

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/process_group.h"

namespace lockstep {

GradBucket::GradBucket(size_t index, torch::Tensor buffer, std::vector<torch::Tensor> gradients,
                       std::vector<torch::Tensor> parameters, bool is_last)
    : index_(index),
      buffer_(std::move(buffer)),
      gradients_(std::move(gradients)),
      parameters_(std::move(parameters)),
      is_last_(is_last) {}

PendingReduction::PendingReduction(std::shared_ptr<Work> work, std::function<void()> on_complete,
                                   torch::Tensor result)
    : finish_([work = std::move(work), on_complete = std::move(on_complete)]() {
        if (work) work->wait();
        if (on_complete) on_complete();
        return torch::Tensor();
      }),
      result_(std::move(result)) {}

PendingReduction::PendingReduction(std::function<torch::Tensor()> finish) : finish_(std::move(finish)) {}

torch::Tensor PendingReduction::wait() {
  if (error_) std::rethrow_exception(error_);
  if (!done_) {
    done_ = true;  // a second wait() must not start the finishing collectives again
    try {
      torch::Tensor produced = finish_();
      if (produced.defined()) result_ = std::move(produced);
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  }
  return result_;
}

// The older contract: the bucket reaches launch() divided (Note [Dividing by the world size]).
std::unique_ptr<PendingReduction> CommHook::run(ProcessGroup& group, const GradBucket& bucket) {
  if (!told_about_launch_) {
    told_about_launch_ = true;
    logger().info("comm hook '{}' implements launch(group, bucket, index), the contract in which DDP divided the "
                  "bucket by the world size before the hook. It still works: DDP divides and calls it. The current "
                  "contract is run(group, GradBucket), where the hook divides itself (comm_hook.h).",
                  name());
  }
  torch::Tensor buffer = bucket.buffer();
  buffer.div_(group.size());
  return launch(group, buffer, bucket.index());
}

std::unique_ptr<PendingReduction> CommHook::launch(ProcessGroup&, torch::Tensor, size_t) {
  LOCKSTEP_FAIL("comm hook '", name(), "' overrides neither run(group, GradBucket) nor the older "
                "launch(group, bucket, index); a hook must implement run() (see comm_hook.h)");
}

void CommHook::load_state(const State& state) {
  LOCKSTEP_CHECK(state.empty(), "comm hook '", name(), "' keeps no state, but the checkpoint holds some for it "
                 "(was it written with another comm_hook?)");
}

std::unique_ptr<PendingReduction> all_reduce_average(ProcessGroup& group, torch::Tensor buffer) {
  buffer.div_(group.size());
  return std::make_unique<PendingReduction>(group.all_reduce(buffer, ReduceOp::kSum, /*async=*/true));
}

std::unique_ptr<PendingReduction> AllReduceHook::run(ProcessGroup& group, const GradBucket& bucket) {
  return all_reduce_average(group, bucket.buffer());
}

CompressHook::CompressHook(c10::ScalarType dtype) : dtype_(dtype) {
  LOCKSTEP_CHECK(dtype == torch::kHalf || dtype == torch::kBFloat16,
                 "a compression hook reduces in float16 or bfloat16, not ", c10::toString(dtype));
}

std::string CompressHook::name() const { return dtype_ == torch::kHalf ? "fp16_compress" : "bf16_compress"; }

std::unique_ptr<PendingReduction> CompressHook::run(ProcessGroup& group, const GradBucket& bucket) {
  torch::Tensor buffer = bucket.buffer();
  // As PyTorch: cast, then divide in the compressed dtype (keeps the sum in range).
  auto compressed = std::make_shared<torch::Tensor>(buffer.to(dtype_).div_(group.size()));
  auto work = group.all_reduce(*compressed, ReduceOp::kSum, /*async=*/true);
  return std::make_unique<PendingReduction>(work, [buffer, compressed]() mutable { buffer.copy_(*compressed); });
}

Registry<CommHook>& comm_hook_registry() {
  static Registry<CommHook> registry("comm hook");
  return registry;
}

std::shared_ptr<CommHook> make_comm_hook(const Config& spec) {
  return comm_hook_registry().build_from_name_or_map(spec);
}

LOCKSTEP_REGISTER(comm_hook_registry(), "allreduce", [](const Config&) { return std::make_shared<AllReduceHook>(); });
LOCKSTEP_REGISTER(comm_hook_registry(), "fp16_compress",
                  [](const Config&) { return std::make_shared<CompressHook>(torch::kHalf); });
LOCKSTEP_REGISTER(comm_hook_registry(), "bf16_compress",
                  [](const Config&) { return std::make_shared<CompressHook>(torch::kBFloat16); });

}  // namespace lockstep
