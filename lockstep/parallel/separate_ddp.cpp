#include "lockstep/parallel/separate_ddp.h"

#include "lockstep/core/error.h"
#include "lockstep/core/spelling.h"

namespace lockstep {

SeparateDistributedDataParallel::SeparateDistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                                 std::shared_ptr<ProcessGroup> group,
                                                                 DDPOptions options) {
  LOCKSTEP_CHECK(module != nullptr, "SeparateDistributedDataParallel needs a module");
  // named_children() is in registration order, the same on every rank, so
  // the DDPs (and their groups) are created in the same order everywhere.
  for (const auto& child : module->named_children()) {
    if (unique_trainable_parameters(*child.value()).empty()) continue;
    children_[child.key()] = std::make_shared<DistributedDataParallel>(child.value(), group, options);
  }
  LOCKSTEP_CHECK(!children_.empty(), "SeparateDistributedDataParallel: no child module has trainable parameters");
}

DistributedDataParallel& SeparateDistributedDataParallel::operator[](const std::string& name) const {
  auto found = children_.find(name);
  LOCKSTEP_CHECK(found != children_.end(), "no wrapped child module named '", name,
                 "'; children with trainable parameters: ", known_names(children_));
  return *found->second;
}

void SeparateDistributedDataParallel::attach(OptimWrapperBase& optim_wrapper) {
  auto wrappers = optim_wrapper.wrappers();
  if (wrappers.size() == 1 && wrappers.front().first.empty()) {
    // One optimizer over the whole model: every child synchronises with it.
    wrappers.front().second->set_gradient_sync(std::shared_ptr<GradientSync>(this, [](GradientSync*) {}));
    return;
  }
  for (auto& [name, wrapper] : wrappers) {
    auto found = children_.find(name);
    LOCKSTEP_CHECK(found != children_.end(), "optim wrapper '", name,
                   "' has no child module of that name with trainable parameters to synchronise");
    wrapper->set_gradient_sync(found->second);
  }
}

void SeparateDistributedDataParallel::begin_forward(bool sync) {
  for (auto& entry : children_) entry.second->begin_forward(sync);
}

void SeparateDistributedDataParallel::begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration) {
  for (auto& entry : children_) entry.second->begin_backward(loss, sync, iteration);
}

void SeparateDistributedDataParallel::end_backward(bool sync) {
  for (auto& entry : children_) entry.second->end_backward(sync);
}

State SeparateDistributedDataParallel::state() const {
  State state;
  for (const auto& [name, ddp] : children_) {
    State child = ddp->state();
    if (!child.empty()) state.put(name, std::move(child));
  }
  return state;
}

void SeparateDistributedDataParallel::load_state(const State& state) {
  for (auto& [name, ddp] : children_) {
    if (state.contains(name)) ddp->load_state(state.get(name));
  }
}

}  // namespace lockstep
