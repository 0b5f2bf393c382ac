// The iteration check of one synchronised DDP backward (Note [The iteration
// check], iteration_check.cpp): every rank's [iteration, diverged, used map],
// gathered asynchronously and verified once per pass.
//
// Internal to lockstep/parallel/ddp; the Reducer runs it.
//
//   detail::IterationCheck check;
//   check.launch(group, iteration, /*diverged=*/false, /*used_map=*/nullptr);
//   ...                                     // the buckets' all-reduces
//   check.verify(group, "", nullptr);       // throws naming ranks out of step
//   check.reset();                          // the next pass
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace lockstep {
class ProcessGroup;
class Work;
}  // namespace lockstep

namespace lockstep::detail {

class IterationCheck {
 public:
  // Sends this rank's row to every rank, without waiting: `iteration`,
  // whether this rank `diverged`, and `used_map` when the pass exchanges one
  // (null: none).
  void launch(ProcessGroup& group, int64_t iteration, bool diverged, const std::vector<int32_t>* used_map);
  bool launched() const { return work_ != nullptr; }
  // Waits for the rows (once per pass; later calls return) and throws a
  // DistributedError naming each rank's iteration when they differ, or the
  // ranks that diverged (`diverged_reason` is this rank's own, if any). With a
  // used map, `globally_used` becomes every rank's map or-ed together.
  void verify(const ProcessGroup& group, const std::string& diverged_reason, std::vector<int32_t>* globally_used);
  // Waits without reading the rows (a pass being dropped).
  void wait();
  // A new pass: nothing launched.
  void reset();

 private:
  torch::Tensor rows_;  // every rank's row, in rank order
  std::shared_ptr<Work> work_;
  bool verified_ = false;
};

}  // namespace lockstep::detail
