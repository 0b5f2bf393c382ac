// JsonWriter: one JSON object per write in <work_dir>/metrics.jsonl.
//
// Each line holds the iteration and the scalars recorded since the previous
// write (detectron2's JSONWriter), flushed at once so `tail -f` and crash
// post-mortems see everything:
//   {"data_time": 0.0002, "iteration": 199, "loss": 0.41, "lr": 0.099, "time": 0.031}
//
//   auto json = std::make_shared<lockstep::JsonWriter>("work_dirs/run/metrics.jsonl");
#pragma once

#include <cstdio>
#include <string>

#include "lockstep/events/log_processor.h"
#include "lockstep/events/event_writer.h"

namespace lockstep {

class JsonWriter : public EventWriter {
 public:
  // Appends to `path` (a resumed run continues the same file).
  // Each scalar as `processor` logs it (events/log_processor.h).
  JsonWriter(std::string path, LogProcessor processor);
  // detectron2's JSONWriter: smoothing-hinted scalars as their median over `window`.
  explicit JsonWriter(std::string path, size_t window = 20);
  ~JsonWriter() override;
  void write(EventStorage& storage, int64_t max_iter) override;
  void close() override;

 private:
  std::string path_;
  LogProcessor processor_;
  std::FILE* file_ = nullptr;
  int64_t last_written_iter_ = -1;
};

}  // namespace lockstep
