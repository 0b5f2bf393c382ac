#include "lockstep/dist/rendezvous.h"

#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/dist/work.h"

namespace lockstep {

void rendezvous(const c10::intrusive_ptr<compat::C10dStore>& store, const std::string& group_name, int rank,
                int size, std::chrono::milliseconds timeout, const std::string& hint) {
  const std::string context = str_cat("rank ", rank, ": rendezvous of group '", group_name, "'");
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + timeout;
  try {
    if (store->add(str_cat("joined/", rank), 1) > 1) {
      LOCKSTEP_FAIL(context, ": another process already joined as rank ", rank,
                    " (two workers with the same RANK, or another job on the same MASTER_ADDR:MASTER_PORT)");
    }
    store->add("joined", 1);
    auto pause = std::chrono::milliseconds(2);
    while (true) {
      int64_t joined = store->add("joined", 0);
      if (joined >= size) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::vector<int> missing;
        for (int r = 0; r < size; ++r) {
          if (!store->check({str_cat("joined/", r)})) missing.push_back(r);
        }
        std::ostringstream list;
        for (size_t i = 0; i < missing.size(); ++i) list << (i ? ", " : "") << missing[i];
        throw TimeoutError(str_cat(context, " timed out after ", detail::format_duration(timeout), ": ", joined,
                                   " of ", size, " ranks arrived; missing ranks [", list.str(), "]",
                                   hint.empty() ? "" : "; ", hint));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(100));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception&) {
    rethrow_with_context(context + " (the rendezvous store failed)");
  }
}

}  // namespace lockstep
