// EventWriter: something that publishes the metrics in an EventStorage
// (console, JSON lines, TensorBoard). PeriodicWriter calls write() every few
// iterations and close() at the end.
//
//   class CsvWriter : public lockstep::EventWriter {
//    public:
//     void write(const lockstep::EventStorage& storage, int64_t max_iter) override { ... }
//   };
#pragma once

#include <cstdint>

#include "lockstep/events/event_storage.h"

namespace lockstep {

class EventWriter {
 public:
  virtual ~EventWriter() = default;
  // `max_iter` lets writers show progress and an ETA.
  virtual void write(EventStorage& storage, int64_t max_iter) = 0;
  virtual void close() {}
};

}  // namespace lockstep
