#include "lockstep/optim/foreach_choice.h"

namespace lockstep {

ForeachChoice* foreach_choice(torch::optim::Optimizer& optimizer) { return dynamic_cast<ForeachChoice*>(&optimizer); }

std::optional<bool> parse_foreach(const Config& section) {
  if (section.is_null() || section.child("foreach").is_null()) return std::nullopt;
  return section.get<bool>("foreach");
}

}  // namespace lockstep
