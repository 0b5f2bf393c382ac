#include "lockstep/engine/checkpointer.h"

#include <filesystem>
#include <fstream>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/engine/trainer.h"

namespace lockstep {
namespace fs = std::filesystem;

namespace {
const char* const kPointer = "last_checkpoint";
}

Checkpointer::Checkpointer(std::shared_ptr<Strategy> strategy, std::string save_dir, RunInfo run,
                           CheckpointOptions options)
    : strategy_(std::move(strategy)), save_dir_(std::move(save_dir)), run_(std::move(run)), options_(options) {
  LOCKSTEP_CHECK(strategy_ != nullptr, "Checkpointer needs a strategy");
}

std::string Checkpointer::save(const std::string& name, const Trainer& trainer) {
  const std::string path = path_of(name);
  if (strategy_->is_main_process()) fs::create_directories(save_dir_);
  CheckpointContents contents;
  contents.trainer = trainer.state();
  contents.meta = RunMeta{run_.seed, trainer.iter(), strategy_->world_size(), strategy_->name(), run_.config};
  strategy_->save_checkpoint(path, std::move(contents), options_);
  if (strategy_->is_main_process()) {
    write_file_atomically(save_dir_ + "/" + kPointer, fs::path(path).filename().string());
    logger().info("Saved checkpoint {}", path);
  }
  return path;
}

void Checkpointer::remove(const std::string& path) {
  if (!strategy_->is_main_process()) return;
  remove_checkpoint(path);
}

std::optional<std::string> Checkpointer::last_checkpoint() const {
  std::ifstream pointer(save_dir_ + "/" + kPointer);
  if (!pointer) return std::nullopt;
  std::string name;
  std::getline(pointer, name);
  if (name.empty()) return std::nullopt;
  return (fs::path(name).is_absolute() ? fs::path(name) : fs::path(save_dir_) / name).string();
}

std::vector<std::string> Checkpointer::resume_candidates() const {
  std::vector<std::string> candidates;
  if (auto last = last_checkpoint()) candidates.push_back(*last);
  // Older checkpoints, newest first, as fallbacks.
  std::vector<std::pair<fs::file_time_type, std::string>> others;
  std::error_code error;
  if (fs::is_directory(save_dir_, error)) {
    for (const auto& entry : fs::directory_iterator(save_dir_, error)) {
      if (!entry.is_regular_file() || entry.path().extension() != ".ckpt") continue;
      const std::string path = entry.path().string();
      if (!candidates.empty() && fs::equivalent(path, candidates.front(), error)) continue;
      others.emplace_back(entry.last_write_time(error), path);
    }
  }
  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  for (const auto& other : others) candidates.push_back(other.second);
  return candidates;
}

namespace {

// Deletes the temporaries of saves that a killed process never finished.
void remove_partial_saves(const std::string& save_dir) {
  std::error_code error;
  if (!fs::is_directory(save_dir, error)) return;
  std::vector<fs::path> partial;
  for (const auto& entry : fs::directory_iterator(save_dir, error)) {
    const std::string name = entry.path().filename().string();
    // AtomicFileWriter's temporaries: ".<name>.ckpt.tmp-XXXXXX".
    if (name.size() > 1 && name[0] == '.' && name.find(".ckpt.tmp-") != std::string::npos) partial.push_back(entry);
  }
  for (const auto& path : partial) {
    logger().warn("Removing {}, a partial checkpoint left by a save that was interrupted", path.string());
    fs::remove(path, error);
  }
}

}  // namespace

std::optional<CheckpointContents> Checkpointer::resume() {
  // Resuming happens before anyone saves again, so no temporary here is live.
  if (strategy_->is_main_process()) remove_partial_saves(save_dir_);
  for (const auto& candidate : resume_candidates()) {
    if (!fs::exists(candidate)) {
      logger().warn("last_checkpoint names {}, which does not exist; looking for an older checkpoint", candidate);
      continue;
    }
    std::string fault = verify_checkpoint_file(candidate);
    if (!fault.empty()) {
      logger().warn("Skipping checkpoint {}: {}; falling back to an older one", candidate, fault);
      continue;
    }
    logger().info("Resuming from {}", candidate);
    return strategy_->load_checkpoint(candidate, /*load_optimizer=*/true, /*load_schedulers=*/true, /*strict=*/true);
  }
  return std::nullopt;
}

}  // namespace lockstep
