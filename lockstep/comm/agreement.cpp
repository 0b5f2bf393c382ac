#include "lockstep/comm/agreement.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/process_group.h"

namespace lockstep {

// Note [An agreement inside an agreement]
// A phase may itself hold an agreement over the same group: resuming agrees
// that every rank loaded the checkpoint chosen, and FSDP's load inside it
// agrees that every rank read its part before the ranks gather again (a
// collective that a rank whose read failed would never join). When that
// inner agreement failed, it failed on every rank of the group, with the
// same message, so the outer one has nothing left to learn: exchanging the
// outcomes again would only wrap the message in "failed on rank 0" (every
// rank failed). It adds its phase in front and throws on, with no
// collective, on every rank alike. A failure agreed over another group (a
// subgroup) is not known to every rank of this one, and goes through the
// exchange as any failure does.
void agree_on_outcome(ProcessGroup& group, const std::string& phase, const std::function<void()>& body) {
  std::exception_ptr error;
  try {
    body();
  } catch (const AgreedFailure& agreed) {
    if (agreed.group() == group.name() && group.size() > 1) {
      throw AgreedFailure(str_cat(phase, ": ", agreed.what()), group.name());
    }
    error = std::current_exception();
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_outcome(group, phase, error);
}

void agree_on_outcome(ProcessGroup& group, const std::string& phase, const std::exception_ptr& local_error) {
  const std::string mine = describe_exception(local_error);
  if (group.size() == 1) {
    if (local_error) throw Error(str_cat(phase, ": ", mine));
    return;
  }
  bool any_failed = false;
  std::vector<nlohmann::json> outcomes;
  try {
    any_failed = any_rank_true(group, local_error != nullptr);
    if (any_failed) {
      outcomes = all_gather_object(nlohmann::json{{"failed", local_error != nullptr}, {"message", mine}},
                                   group.shared_from_this());
    }
  } catch (...) {
    // A peer that died in the phase breaks the agreement itself.
    throw DistributedError(str_cat(
        phase, ": could not agree on the outcome with the other ranks of group '", group.name(), "' (",
        describe_exception(std::current_exception()), ")",
        local_error ? "; on this rank it failed: " + mine : std::string("; on this rank it succeeded")));
  }
  if (!any_failed) return;
  int first = -1;
  std::string others;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (!outcomes[r].value("failed", false)) continue;
    if (first < 0) {
      first = static_cast<int>(r);
    } else {
      others += (others.empty() ? "" : ", ") + std::to_string(group.global_rank(static_cast<int>(r)));
    }
  }
  LOCKSTEP_CHECK(first >= 0, phase, ": a rank reported a failure but none described it");
  throw AgreedFailure(str_cat(phase, ": failed on rank ", group.global_rank(first), " of ", group.size(), ": ",
                              outcomes[static_cast<size_t>(first)].value("message", std::string()),
                              others.empty() ? "" : " (it failed on rank(s) " + others + " too)"),
                      group.name());
}

bool any_rank_true(ProcessGroup& group, bool local) {
  if (group.size() == 1) return local;
  torch::Tensor flag = torch::tensor({local ? 1 : 0}, torch::kInt);
  group.all_reduce(flag, ReduceOp::kMax);
  return flag.item<int>() != 0;
}

}  // namespace lockstep
