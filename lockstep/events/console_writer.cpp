#include "lockstep/events/console_writer.h"

#include <sstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "lockstep/core/logging.h"
#include "lockstep/core/step_metrics.h"

namespace lockstep {

std::string format_duration(double seconds) {
  if (seconds < 0) seconds = 0;
  auto total = static_cast<int64_t>(seconds + 0.5);
  int64_t days = total / 86400;
  total %= 86400;
  std::string text = fmt::format("{}:{:02d}:{:02d}", total / 3600, (total % 3600) / 60, total % 60);
  if (days > 0) text = fmt::format("{} day{}, ", days, days > 1 ? "s" : "") + text;
  return text;
}

ConsoleWriter::ConsoleWriter(size_t window) : ConsoleWriter(LogProcessor::detectron2(window)) {}

ConsoleWriter::ConsoleWriter(LogProcessor processor) : processor_(std::move(processor)) {}

std::optional<double> ConsoleWriter::eta_seconds(EventStorage& storage, int64_t iteration, int64_t max_iter) {
  if (max_iter >= kNoEnd) return std::nullopt;  // a run without an end has no ETA
  const int64_t remaining = max_iter - iteration - 1;
  if (remaining <= 0) return 0.0;
  if (storage.has("time")) {
    // detectron2: the median of recent step times is robust to eval pauses.
    return storage.history("time").median(1000) * static_cast<double>(remaining);
  }
  auto now = std::chrono::steady_clock::now();
  std::optional<double> eta;
  if (last_write_ && iteration > last_write_->first) {
    double per_iter = std::chrono::duration<double>(now - last_write_->second).count() /
                      static_cast<double>(iteration - last_write_->first);
    eta = per_iter * static_cast<double>(remaining);
  }
  last_write_ = std::make_pair(iteration, now);
  return eta;
}

std::string ConsoleWriter::format_line(EventStorage& storage, int64_t max_iter) {
  const int64_t iteration = storage.iter();
  std::ostringstream line;
  if (auto eta = eta_seconds(storage, iteration, max_iter)) line << "eta: " << format_duration(*eta) << "  ";
  line << "iter: " << iteration;
  if (max_iter < kNoEnd) line << "/" << max_iter;
  auto latest = storage.latest();
  auto histories = storage.histories();
  const auto window = static_cast<int64_t>(processor_.window());
  // Losses first (smoothed), then the step's timing, then everything else.
  for (const auto& [name, event] : latest) {
    if (name.find("loss") == std::string::npos || name.find('/') != std::string::npos) continue;
    if (event.iteration < iteration - window) continue;
    line << fmt::format("  {}: {:.4g}", name, processor_.value_of(name, histories.at(name), /*smoothing_hint=*/true));
  }
  for (const char* name : {"time", "data_time"}) {
    auto found = histories.find(name);
    if (found != histories.end()) line << fmt::format("  {}: {:.4f}", name, found->second.avg(processor_.window()));
  }
  auto lr = latest.find("lr");
  if (lr != latest.end()) line << fmt::format("  lr: {:.5g}", lr->second.value);
  for (const auto& [name, event] : latest) {
    if (name.rfind("lr/", 0) == 0) line << fmt::format("  {}: {:.5g}", name, event.value);
  }
  auto grad_norm = histories.find("grad_norm");
  if (grad_norm != histories.end()) {
    line << fmt::format("  grad_norm: {:.4g}", processor_.value_of("grad_norm", grad_norm->second, /*smoothing_hint=*/true));
  }
  if (torch::cuda::is_available()) {
    // Peak memory is reported by the memory-stats hook when CUDA is used.
    auto mem = latest.find("max_mem_mb");
    if (mem != latest.end()) line << fmt::format("  max_mem: {:.0f}M", mem->second.value);
  }
  return line.str();
}

void ConsoleWriter::write(EventStorage& storage, int64_t max_iter) {
  logger().info("{}", format_line(storage, max_iter));
}

}  // namespace lockstep
