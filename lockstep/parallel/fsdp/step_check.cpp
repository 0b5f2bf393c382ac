#include "lockstep/parallel/fsdp/step_check.h"

#include "lockstep/core/error.h"
#include "lockstep/core/rng.h"
#include "lockstep/comm/process_group.h"

namespace lockstep::fsdp {
namespace {
constexpr uint64_t kEmptyHash = 0x5eed5eed5eed5eedULL;
}  // namespace

StepCheck::StepCheck(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)), hash_(kEmptyHash) {}

StepCheck::~StepCheck() {
  try {
    if (work_) work_->wait();
  } catch (...) {
  }
}

void StepCheck::record(int unit, Kind kind, uint64_t detail) {
  hash_ = splitmix64(hash_ ^ (static_cast<uint64_t>(unit) << 3 | static_cast<uint64_t>(kind)));
  if (detail != 0) hash_ = splitmix64(hash_ ^ detail);
  count_ += 1;
}

void StepCheck::launch(int64_t iteration) {
  if (!group_ || group_->size() == 1) {
    hash_ = kEmptyHash;
    count_ = 0;
    return;
  }
  verify();  // at most one exchange in flight
  mine_ = torch::tensor({iteration, count_, static_cast<int64_t>(hash_)}, torch::kLong);
  gathered_ = torch::empty({group_->size() * 3}, torch::kLong);
  work_ = group_->all_gather_into_tensor(gathered_, mine_, /*async=*/true);
  hash_ = kEmptyHash;
  count_ = 0;
}

void StepCheck::verify() {
  if (!work_) return;
  auto work = std::move(work_);
  work_.reset();
  auto out_of_step = [](const DistributedError& error) {
    LOCKSTEP_FAIL("FSDP ranks are out of step: ", error.what(),
                  ". The ranks named never reached this point of the step: they wait in a unit gather or "
                  "reduction this rank did not issue, so the ranks ran different units (one skipped a unit, or took "
                  "a data-dependent branch around it) or a different number of steps.");
  };
  try {
    work->wait();
  } catch (const TimeoutError& error) {
    out_of_step(error);
  } catch (const PeerLostError& error) {  // they timed out first, in that gather or reduction
    out_of_step(error);
  }
  auto data = gathered_.accessor<int64_t, 1>();
  bool same = true;
  for (int r = 1; r < group_->size(); ++r) {
    for (int k = 0; k < 3; ++k) same = same && data[r * 3 + k] == data[k];
  }
  if (same) return;
  std::string ranks;
  for (int r = 0; r < group_->size(); ++r) {
    ranks += str_cat(r ? "; " : "", "rank ", group_->global_rank(r), " at iteration ", data[r * 3], " after ",
                     data[r * 3 + 1], " unit collectives (sequence hash ", std::hex, data[r * 3 + 2], std::dec, ")");
  }
  LOCKSTEP_FAIL("FSDP ranks are out of step: ", ranks,
                ". Their gathers and gradient reductions paired up across different iterations or different "
                "units, so the gradients just reduced mix what the ranks computed. Every rank must run forward "
                "and backward in the same iterations, through the same units in the same order (no rank may skip "
                "a step or take a data-dependent branch around a unit).");
}

}  // namespace lockstep::fsdp
