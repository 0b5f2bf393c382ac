// PeriodicWriter: runs the event writers every `period` iterations, at the
// last iteration, and once more (then closes them) after training. Register
// it last so it sees what the other hooks recorded in the same step.
//
//   auto writer = std::make_shared<lockstep::PeriodicWriter>(
//       std::vector<std::shared_ptr<lockstep::EventWriter>>{console, json}, /*period=*/20);
#pragma once

#include <memory>
#include <vector>

#include "lockstep/engine/hook.h"
#include "lockstep/events/event_writer.h"

namespace lockstep {

class PeriodicWriter : public Hook {
 public:
  PeriodicWriter(std::vector<std::shared_ptr<EventWriter>> writers, int64_t period = 20);
  void after_step() override;
  void after_train() override;

 private:
  std::vector<std::shared_ptr<EventWriter>> writers_;
  int64_t period_;
};

}  // namespace lockstep
