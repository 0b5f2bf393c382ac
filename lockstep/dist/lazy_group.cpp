#include "lockstep/dist/lazy_group.h"

#include <numeric>
#include <vector>

#include "lockstep/dist/process_group.h"

namespace lockstep {

LazyGroup::LazyGroup(std::shared_ptr<ProcessGroup> parent, std::string name)
    : parent_(std::move(parent)), name_(std::move(name)) {}

std::shared_ptr<ProcessGroup> LazyGroup::get() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (group_ == nullptr) {
    std::vector<int> everyone(static_cast<size_t>(parent_->size()));
    std::iota(everyone.begin(), everyone.end(), 0);
    group_ = parent_->new_group(everyone, name_);
  }
  return group_;
}

}  // namespace lockstep
