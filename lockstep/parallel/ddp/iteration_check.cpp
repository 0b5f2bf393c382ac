#include "lockstep/parallel/ddp/internal/iteration_check.h"

#include <algorithm>
#include <functional>

#include "lockstep/core/error.h"
#include "lockstep/comm/process_group.h"

namespace lockstep::detail {

// Note [The iteration check]
// DDP's collectives carry no names: a rank that skipped a step's backward (or
// ran an extra one) would pair its buckets with the others' buckets of
// another iteration, and gradients of different iterations would be averaged
// together without a sign. So every synchronised backward also all-gathers,
// from every rank, [iteration, diverged, which parameters this rank used]:
// the iteration (the trainer's, given to begin_backward; without a trainer
// the optim wrapper's own count of backward passes) catches a rank that
// skipped a step, and every rank fails naming each rank's iteration;
// `diverged` catches a rank whose optimizer step failed after an earlier
// reduction (mark_diverged: such a step cannot be dropped, see
// Note [Dropping a failed step]); the used map, when this pass exchanges one,
// tells parameters unused everywhere from those unused only here
// (Note [Unused parameters get no gradient]).
//
// It costs no round trip of its own. Without a used map to exchange, the
// check goes out in start_pass, when backward starts, ahead of every bucket:
// it completes while backward computes, and finalize_backward reads it before
// waiting for any bucket, so that ranks out of step are named even when their
// buckets' collectives no longer match. Only when a used map must be
// exchanged (find_unused_parameters, a static graph's first pass) does it wait
// for the end of backward, going out after the last bucket, as PyTorch's
// used-map all_reduce does. A rank that fails before any forward cannot know
// which collectives the others run next, so it does not guess: the next
// backward's check names the rank out of step
// (DistributedDataParallel::step_failed). FSDP checks the same with a hash of
// its unit collectives (Note [FSDP's step check]).
//
namespace {

// A row's layout.
constexpr int64_t kCheckIteration = 0;
constexpr int64_t kCheckDiverged = 1;
constexpr int64_t kCheckUsedMap = 2;

}  // namespace

void IterationCheck::launch(ProcessGroup& group, int64_t iteration, bool diverged,
                            const std::vector<int32_t>* used_map) {
  const int64_t length = kCheckUsedMap + (used_map ? static_cast<int64_t>(used_map->size()) : 0);
  torch::Tensor mine = torch::empty({length}, torch::kInt);
  auto data = mine.data_ptr<int32_t>();
  data[kCheckIteration] = static_cast<int32_t>(iteration);
  data[kCheckDiverged] = diverged ? 1 : 0;
  if (used_map) std::copy(used_map->begin(), used_map->end(), data + kCheckUsedMap);
  rows_ = torch::empty({group.size() * length}, torch::kInt);
  work_ = group.all_gather_into_tensor(rows_, mine, /*async=*/true);
}

void IterationCheck::verify(const ProcessGroup& group, const std::string& diverged_reason,
                            std::vector<int32_t>* globally_used) {
  if (!work_ || verified_) return;
  work_->wait();
  verified_ = true;
  const int64_t length = rows_.numel() / group.size();
  auto data = rows_.data_ptr<int32_t>();
  std::vector<int32_t> sequence(static_cast<size_t>(group.size()));
  for (int r = 0; r < group.size(); ++r) sequence[static_cast<size_t>(r)] = data[r * length + kCheckIteration];
  if (std::adjacent_find(sequence.begin(), sequence.end(), std::not_equal_to<>()) != sequence.end()) {
    std::string text;
    for (int r = 0; r < group.size(); ++r) {
      text += (r ? ", " : "") + std::string("rank ") + std::to_string(group.global_rank(r)) + " at iteration " +
              std::to_string(sequence[static_cast<size_t>(r)]);
    }
    throw DistributedError(str_cat(
        "DDP ranks are out of step: they reduced gradients of different iterations together (", text,
        "). A rank skipped a step's backward pass (or ran an extra one); every rank must run backward in the same "
        "iterations."));
  }
  std::string diverged;
  for (int r = 0; r < group.size(); ++r) {
    if (data[r * length + kCheckDiverged] != 0) {
      diverged += (diverged.empty() ? "" : ", ") + std::to_string(group.global_rank(r));
    }
  }
  if (!diverged.empty()) {
    throw DistributedError(str_cat(
        "DDP: rank(s) ", diverged, " failed after the gradients of an earlier step were reduced (",
        diverged_reason.empty() ? std::string("see that rank's error") : diverged_reason,
        "), so their weights may differ from the other ranks': such a step cannot be dropped. Restart from the "
        "last checkpoint."));
  }
  if (globally_used != nullptr && length > kCheckUsedMap) {
    for (size_t i = 0; i < globally_used->size(); ++i) {
      int32_t used = 0;
      for (int r = 0; r < group.size(); ++r) used |= data[r * length + kCheckUsedMap + static_cast<int64_t>(i)];
      (*globally_used)[i] = used;
    }
  }
}

void IterationCheck::wait() {
  if (work_) work_->wait();
}

void IterationCheck::reset() {
  work_.reset();
  verified_ = false;
}

}  // namespace lockstep::detail
