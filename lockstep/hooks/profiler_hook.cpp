#include "lockstep/hooks/profiler_hook.h"

#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

ProfilerHook::ProfilerHook(std::string output_path, int64_t begin, int64_t end, bool record_shapes, bool profile_memory)
    : Hook("ProfilerHook"),
      output_path_(std::move(output_path)),
      begin_(begin),
      end_(end),
      record_shapes_(record_shapes),
      profile_memory_(profile_memory) {
  LOCKSTEP_CHECK(begin_ >= 0 && end_ > begin_, "ProfilerHook: need 0 <= begin < end, got begin ", begin_, ", end ",
                 end_);
}

void ProfilerHook::before_step() {
  if (trainer().iter() == begin_ && !profiler_) {
    profiler_ = std::make_unique<compat::CpuProfiler>(record_shapes_, profile_memory_);
  }
}

void ProfilerHook::after_step() {
  if (profiler_ && trainer().iter() + 1 >= end_) finish();
}

void ProfilerHook::after_train() {
  if (profiler_) finish();
}

void ProfilerHook::finish() {
  std::filesystem::create_directories(std::filesystem::path(output_path_).parent_path());
  profiler_->stop_and_write(output_path_);
  profiler_.reset();
  logger().info("ProfilerHook: iterations {}..{} written to {}", begin_, std::min(end_, trainer().iter() + 1) - 1,
                output_path_);
}

LOCKSTEP_REGISTER(hook_registry(), "ProfilerHook", [](const Config& cfg, const HookContext& context) {
  const int64_t begin = cfg.get<int64_t>("begin", 0);
  const int64_t end = cfg.get<int64_t>("end", begin + 1);
  LOCKSTEP_CHECK(begin >= 0 && end > begin, cfg.where("end"), ": need 0 <= begin < end, got begin ", begin, ", end ",
                 end);
  const int rank = context.collectives->rank();
  const std::string path = context.work_dir + "/profiler/trace_rank" + std::to_string(rank) + ".json";
  return std::make_shared<ProfilerHook>(path, begin, end, cfg.get<bool>("record_shapes", false),
                                        cfg.get<bool>("profile_memory", false));
});

}  // namespace lockstep
