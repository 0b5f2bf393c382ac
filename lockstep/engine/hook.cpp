// Hook's own methods and the named priorities (see hook.h).
#include "lockstep/engine/hook.h"

#include <string>

#include "lockstep/core/error.h"
#include "lockstep/engine/trainer.h"

namespace lockstep {

Trainer& Hook::trainer() const {
  LOCKSTEP_CHECK(trainer_ != nullptr, "hook '", name_, "' is not registered with a trainer");
  return *trainer_;
}

void Hook::set_priority(int priority) {
  LOCKSTEP_CHECK(trainer_ == nullptr, "hook '", name_, "': set its priority before registering it");
  priority_ = priority;
}

namespace {
const std::pair<const char*, int> kPriorityNames[] = {
    {"HIGHEST", kHighest}, {"VERY_HIGH", kVeryHigh}, {"HIGH", kHigh}, {"ABOVE_NORMAL", kAboveNormal},
    {"NORMAL", kNormal},   {"BELOW_NORMAL", kBelowNormal}, {"LOW", kLow}, {"VERY_LOW", kVeryLow},
    {"LOWEST", kLowest}};
}  // namespace

int parse_hook_priority(const std::string& text) {
  for (const auto& [name, value] : kPriorityNames) {
    if (text == name) return value;
  }
  try {
    size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  std::string names;
  for (const auto& entry : kPriorityNames) names += (names.empty() ? "" : ", ") + std::string(entry.first);
  LOCKSTEP_FAIL("unknown hook priority '", text, "'; expected an integer or one of ", names);
}

std::string hook_priority_name(int priority) {
  for (const auto& [name, value] : kPriorityNames) {
    if (priority == value) return name;
  }
  return std::to_string(priority);
}

}  // namespace lockstep
