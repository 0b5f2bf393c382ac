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
  if (strategy_->collectives()->is_main_process()) {
    std::error_code error;
    fs::create_directories(save_dir_, error);
    LOCKSTEP_CHECK(!error, "cannot write the checkpoint ", path, ": its folder cannot be made (", error.message(), ")");
  }
  CheckpointContents contents;
  contents.trainer = trainer.state();
  contents.meta = RunMeta{run_.seed, trainer.iter(), strategy_->collectives()->world_size(), strategy_->name(), run_.config};
  // The pointer moves once the checkpoint is whole (later, for a save in the background).
  const std::string pointer = save_dir_ + "/" + kPointer;
  strategy_->save_checkpoint_then(path, std::move(contents), options_, [pointer, path] {
    write_file_atomically(pointer, fs::path(path).filename().string());
    logger().info("Saved checkpoint {}", path);
  });
  return path;
}

void Checkpointer::remove(const std::string& path) {
  // Not before the save in flight is whole: it is what replaces this one.
  strategy_->after_checkpoint_saves([path] { remove_checkpoint(path); });
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

// Note [One resume decision]
// Every rank used to choose the checkpoint on its own, reading each candidate
// whole up to three times (verify, seed, load). Ranks could then disagree (a
// file still being written seen by one rank only, a read error on one node),
// and a rank whose read failed left the others alone in a collective until the
// timeout. Now rank 0 alone verifies candidates, newest first, reads the seed
// from the one it picks (the seed must come from the checkpoint actually
// resumed, not from a newer one that was skipped), and broadcasts both. Every
// rank then reads that file once, under an agreement (comm/agreement.h), so a
// rank that cannot read it fails every rank with its path and reason.
//
// The seed of a resumed run (Runner, runner.cpp) follows from this choice: a
// seed set in the config (randomness.seed) wins; otherwise the seed recorded
// in the meta of the checkpoint chosen here (ResumeChoice::seed), so that the
// resumed run replays the same data order as the run that wrote it; only a
// run with neither (not resuming, nothing to resume, or a checkpoint that
// records no seed) draws a fresh seed, rank 0's, broadcast to every rank.
// Because the seed must be set before the model is built, the Runner makes
// the choice first (choose_resume) and reads the file later, once the model
// exists (load), instead of calling resume(); the same choice serves both.
std::optional<ResumeChoice> Checkpointer::choose_resume() {
  nlohmann::json choice = nlohmann::json::object();
  std::string error;
  if (strategy_->collectives()->is_main_process()) {
    try {
      // Resuming happens before anyone saves again, so no temporary here is live.
      remove_partial_saves(save_dir_);
      for (const auto& candidate : resume_candidates()) {
        if (!fs::exists(candidate)) {
          logger().warn("last_checkpoint names {}, which does not exist; looking for an older checkpoint", candidate);
          continue;
        }
        const std::string fault = verify_checkpoint_file(candidate);
        if (!fault.empty()) {
          logger().warn("Skipping checkpoint {}: {}; falling back to an older one", candidate, fault);
          continue;
        }
        choice["path"] = candidate;
        if (auto meta = read_checkpoint_meta(candidate)) choice["seed"] = meta->seed;
        break;
      }
    } catch (...) {
      error = describe_exception(std::current_exception());
    }
    choice["error"] = error;
  }
  choice = strategy_->collectives()->broadcast_from_main(choice);
  LOCKSTEP_CHECK(choice.value("error", std::string()).empty(), "resume: rank 0 could not choose a checkpoint in ",
                 save_dir_, ": ", choice.value("error", std::string()));
  if (!choice.contains("path")) return std::nullopt;
  ResumeChoice result;
  result.path = choice.at("path").get<std::string>();
  if (choice.contains("seed")) result.seed = choice.at("seed").get<uint64_t>();
  return result;
}

CheckpointContents Checkpointer::load(const ResumeChoice& choice) {
  logger().info("Resuming from {}", choice.path);
  CheckpointContents contents;
  strategy_->collectives()->agree(str_cat("resume: loading ", choice.path, " (chosen by rank 0)"), [&] {
    contents = strategy_->load_checkpoint(choice.path, /*load_optimizer=*/true, /*load_schedulers=*/true,
                                          /*strict=*/true);
  });
  return contents;
}

std::optional<CheckpointContents> Checkpointer::resume() {
  std::optional<ResumeChoice> choice = choose_resume();
  if (!choice) return std::nullopt;
  return load(*choice);
}

}  // namespace lockstep
