#include "lockstep/comm/rendezvous.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/comm/work.h"

namespace lockstep {

// Each rank checks in with two adds; the one that completes the group sets
// "all_joined", which the others wait for in one call: three store operations
// per rank however many ranks there are and however long the last one takes
// to start (tests/scale counts them). A wait that runs out lists who is missing.
void rendezvous(const c10::intrusive_ptr<compat::C10dStore>& store, const std::string& group_name, int rank,
                int size, std::chrono::milliseconds timeout, const std::string& hint) {
  const std::string context = str_cat("rank ", rank, ": rendezvous of group '", group_name, "'");
  try {
    if (store->add(str_cat("joined/", rank), 1) > 1) {
      LOCKSTEP_FAIL(context, ": another process already joined as rank ", rank,
                    " (two workers with the same RANK, or another job on the same MASTER_ADDR:MASTER_PORT)");
    }
    if (store->add("joined", 1) == size) store->set("all_joined", std::vector<uint8_t>{1});
    try {
      store->wait({"all_joined"}, timeout);
      return;
    } catch (const std::exception&) {
      if (store->check({"all_joined"})) throw;  // the store failed, not the group
    }
    const int64_t joined = store->add("joined", 0);
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store->check({str_cat("joined/", r)})) missing.push_back(r);
    }
    std::ostringstream list;
    for (size_t i = 0; i < missing.size(); ++i) list << (i ? ", " : "") << missing[i];
    throw TimeoutError(str_cat(context, " timed out after ", detail::format_duration(timeout), ": ", joined, " of ",
                               size, " ranks arrived; missing ranks [", list.str(), "]", hint.empty() ? "" : "; ",
                               hint));
  } catch (const Error&) {
    throw;
  } catch (const std::exception&) {
    rethrow_with_context(context + " (the rendezvous store failed)");
  }
}

}  // namespace lockstep
