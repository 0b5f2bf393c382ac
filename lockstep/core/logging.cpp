#include "lockstep/core/logging.h"

#include <mutex>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace lockstep {
namespace {

struct LoggerState {
  std::shared_ptr<spdlog::logger> logger;
  std::shared_ptr<spdlog::sinks::sink> console;
  int rank = 0;
  int world_size = 1;
};

LoggerState& state() {
  static LoggerState* instance = [] {
    auto* created = new LoggerState();
    created->console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
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

int log_rank() { return state().rank; }

}  // namespace lockstep
