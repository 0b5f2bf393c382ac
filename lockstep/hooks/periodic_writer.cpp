#include "lockstep/hooks/periodic_writer.h"

#include "lockstep/core/error.h"
#include "lockstep/engine/trainer.h"

namespace lockstep {

PeriodicWriter::PeriodicWriter(std::vector<std::shared_ptr<EventWriter>> writers, int64_t period)
    : Hook("PeriodicWriter"), writers_(std::move(writers)), period_(period) {
  LOCKSTEP_CHECK(period_ >= 1, "PeriodicWriter period must be at least 1, got ", period_);
}

void PeriodicWriter::after_step() {
  const int64_t iteration = trainer().iter();
  if ((iteration + 1) % period_ == 0 || iteration == trainer().max_iter() - 1) {
    for (auto& writer : writers_) writer->write(trainer().storage(), trainer().max_iter());
  }
}

void PeriodicWriter::after_train() {
  for (auto& writer : writers_) {
    // The final write publishes whatever after_train hooks before us recorded (the final eval).
    writer->write(trainer().storage(), trainer().max_iter());
    writer->close();
  }
}

}  // namespace lockstep
