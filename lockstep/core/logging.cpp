#include "lockstep/core/logging.h"

#include <algorithm>
#include <mutex>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "lockstep/core/status_line.h"

namespace lockstep {
namespace {

// The console sink, written above the terminal's status line (the progress
// bar, core/status_line.h) so that both stay whole. Its own level decides
// (set_log_rank); the colour sink inside writes whatever it is given.
class AboveStatusLineSink : public spdlog::sinks::sink {
 public:
  explicit AboveStatusLineSink(std::shared_ptr<spdlog::sinks::sink> inner) : inner_(std::move(inner)) {
    inner_->set_level(spdlog::level::trace);
  }
  void log(const spdlog::details::log_msg& message) override {
    StatusLine::for_stderr().write_above([&] {
      inner_->log(message);
      inner_->flush();
    });
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
};

struct LoggerState {
  std::shared_ptr<spdlog::logger> logger;
  std::shared_ptr<spdlog::sinks::sink> console;
  int rank = 0;
  int world_size = 1;
};

LoggerState& state() {
  static LoggerState* instance = [] {
    auto* created = new LoggerState();
    created->console =
        std::make_shared<AboveStatusLineSink>(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    created->console->set_pattern("[%m/%d %H:%M:%S %^%l%$] %v");
    created->console->set_level(spdlog::level::info);
    created->logger = std::make_shared<spdlog::logger>("lockstep", created->console);
    created->logger->set_level(spdlog::level::debug);
    created->logger->flush_on(spdlog::level::info);
    return created;
  }();
  return *instance;
}

}  // namespace

spdlog::logger& logger() { return *state().logger; }

void set_log_rank(int rank, int world_size) {
  auto& current = state();
  current.rank = rank;
  current.world_size = world_size;
  if (world_size > 1) {
    current.console->set_pattern("[%m/%d %H:%M:%S %^%l%$ rank" + std::to_string(rank) + "] %v");
  }
  current.console->set_level(rank == 0 ? spdlog::level::info : spdlog::level::warn);
}

void add_log_file(const std::string& path) {
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e %l] %v");
  sink->set_level(spdlog::level::debug);
  state().logger->sinks().push_back(sink);
}

void remove_log_file(const std::string& path) {
  auto& sinks = state().logger->sinks();
  sinks.erase(std::remove_if(sinks.begin(), sinks.end(),
                             [&](const spdlog::sink_ptr& sink) {
                               auto file = std::dynamic_pointer_cast<spdlog::sinks::basic_file_sink_mt>(sink);
                               return file != nullptr && file->filename() == path;
                             }),
              sinks.end());
}

int log_rank() { return state().rank; }

}  // namespace lockstep
