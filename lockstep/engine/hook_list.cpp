#include "lockstep/engine/hook_list.h"

#include <algorithm>
#include <set>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"

namespace lockstep {

void HookList::add(const std::vector<std::shared_ptr<Hook>>& hooks, Trainer& trainer) {
  for (const auto& hook : hooks) {
    if (!hook || !hook->active()) continue;
    LOCKSTEP_CHECK(hook->trainer_ == nullptr || hook->trainer_ == &trainer, "hook '", hook->name(),
                   "' is already registered with another trainer");
    hook->trainer_ = &trainer;
    // After every hook of the same or a higher priority (a lower number).
    auto position = std::find_if(hooks_.begin(), hooks_.end(), [&](const std::shared_ptr<Hook>& other) {
      return other->priority() > hook->priority();
    });
    hooks_.insert(position, hook);
  }
}

void HookList::log_order() const {
  std::string text;
  for (const auto& hook : hooks_) {
    text += fmt::format("\n  ({:<12}) {}", hook_priority_name(hook->priority()), hook->name());
  }
  logger().info("Hooks, in the order every stage runs them:{}", text);
}

void HookList::before_train() {
  for (auto& hook : hooks_) hook->before_train();
}

void HookList::after_train(std::exception_ptr first_error) {
  for (auto& hook : hooks_) {
    try {
      hook->after_train();
    } catch (...) {
      logger().error("Hook '{}' failed in after_train: {}", hook->name(), describe_exception(std::current_exception()));
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

void HookList::before_train_epoch() {
  for (auto& hook : hooks_) hook->before_train_epoch();
}

void HookList::after_train_epoch() {
  for (auto& hook : hooks_) hook->after_train_epoch();
}

void HookList::before_step() {
  for (auto& hook : hooks_) hook->before_step();
}

void HookList::after_backward() {
  for (auto& hook : hooks_) hook->after_backward();
}

void HookList::after_step() {
  for (auto& hook : hooks_) hook->after_step();
}

void HookList::before_eval_epoch(bool test) {
  for (auto& hook : hooks_) test ? hook->before_test_epoch() : hook->before_val_epoch();
}

void HookList::after_eval_epoch(bool test, const std::map<std::string, double>& metrics) {
  for (auto& hook : hooks_) test ? hook->after_test_epoch(metrics) : hook->after_val_epoch(metrics);
}

void HookList::before_eval_iter(bool test, int64_t batch_index, const Batch& batch) {
  for (auto& hook : hooks_) {
    test ? hook->before_test_iter(batch_index, batch) : hook->before_val_iter(batch_index, batch);
  }
}

void HookList::after_eval_iter(bool test, int64_t batch_index, const Batch& batch, const Batch& outputs) {
  for (auto& hook : hooks_) {
    test ? hook->after_test_iter(batch_index, batch, outputs) : hook->after_val_iter(batch_index, batch, outputs);
  }
}

std::vector<int64_t> HookList::stop_vote_intervals() const {
  std::vector<int64_t> intervals;
  for (const auto& hook : hooks_) {
    if (!hook->may_request_stop()) continue;
    LOCKSTEP_CHECK(hook->stop_vote_interval() >= 1, "hook ", hook->name(), ": stop_vote_interval() must be at least 1");
    intervals.push_back(hook->stop_vote_interval());
  }
  return intervals;
}

State HookList::state() const {
  State states;
  for (const auto& hook : hooks_) {
    if (hook->stateful()) states.put(hook->name(), hook->state());
  }
  return states;
}

void HookList::load_state(const State& states) {
  std::set<std::string> claimed;
  for (auto& hook : hooks_) {
    if (!hook->stateful() || !states.contains(hook->name())) continue;
    hook->load_state(states.get(hook->name()));
    claimed.insert(hook->name());
  }
  if (states.values.is_object()) {
    for (const auto& entry : states.values.items()) {
      if (claimed.count(entry.key()) == 0) {
        logger().warn("Cannot find a hook named '{}' to load its state from the checkpoint", entry.key());
      }
    }
  }
}

void HookList::before_save_checkpoint(State& checkpoint) const {
  for (const auto& hook : hooks_) hook->before_save_checkpoint(checkpoint);
}

void HookList::after_load_checkpoint(const State& checkpoint) const {
  for (const auto& hook : hooks_) hook->after_load_checkpoint(checkpoint);
}

}  // namespace lockstep
