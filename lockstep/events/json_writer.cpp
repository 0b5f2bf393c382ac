#include "lockstep/events/json_writer.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "lockstep/core/error.h"

namespace lockstep {

JsonWriter::JsonWriter(std::string path, size_t window) : JsonWriter(std::move(path), LogProcessor::detectron2(window)) {}

JsonWriter::JsonWriter(std::string path, LogProcessor processor)
    : path_(std::move(path)), processor_(std::move(processor)) {
  file_ = std::fopen(path_.c_str(), "a");
  LOCKSTEP_CHECK(file_ != nullptr, "cannot open ", path_, " for metrics: ", std::strerror(errno));
}

JsonWriter::~JsonWriter() { close(); }

void JsonWriter::write(EventStorage& storage, int64_t /*max_iter*/) {
  if (file_ == nullptr) return;
  // Group the new scalars by the iteration they belong to: eval metrics and
  // step metrics of different iterations get lines of their own.
  std::map<int64_t, nlohmann::json> by_iteration;
  for (const auto& [name, event] : processor_.summarize(storage)) {
    if (event.iteration <= last_written_iter_) continue;
    // JSON has no NaN or infinity; write them as strings so the line stays valid.
    if (std::isfinite(event.value)) {
      by_iteration[event.iteration][name] = event.value;
    } else {
      by_iteration[event.iteration][name] = std::isnan(event.value) ? "NaN" : (event.value > 0 ? "Infinity" : "-Infinity");
    }
  }
  for (auto& [iteration, scalars] : by_iteration) {
    scalars["iteration"] = iteration;
    std::string line = scalars.dump() + "\n";
    LOCKSTEP_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size(), "writing ", path_, " failed: ",
                   std::strerror(errno));
    last_written_iter_ = std::max(last_written_iter_, iteration);
  }
  LOCKSTEP_CHECK(std::fflush(file_) == 0, "flushing ", path_, " failed: ", std::strerror(errno));
}

void JsonWriter::close() {
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
}

}  // namespace lockstep
