// NCCL lives in its own file: its headers exist only in CUDA builds of
// libtorch, and the rest of the compat layer must build without them.
#include "lockstep/compat/c10d.h"

#include <algorithm>
#include <cstdlib>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"

#if defined(LOCKSTEP_WITH_CUDA) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define LOCKSTEP_COMPAT_NCCL 1
#else
#define LOCKSTEP_COMPAT_NCCL 0
#endif

namespace lockstep::compat {

bool has_nccl() { return LOCKSTEP_COMPAT_NCCL != 0; }

bool is_nccl(const C10dGroup& group) {
#if LOCKSTEP_COMPAT_NCCL
  return dynamic_cast<const c10d::ProcessGroupNCCL*>(&group) != nullptr;
#else
  (void)group;
  return false;
#endif
}

NcclWaitSettings nccl_wait_settings(std::chrono::milliseconds group_timeout, int torch_major, int torch_minor,
                                    const std::function<const char*(const char*)>& getenv) {
  NcclWaitSettings settings;
  const std::chrono::milliseconds margin =
      std::max<std::chrono::milliseconds>(group_timeout / 10, std::chrono::seconds(30));
  settings.watchdog_timeout = group_timeout + margin;
  const bool torch_names = torch_major > 2 || (torch_major == 2 && torch_minor >= 2);  // TORCH_NCCL_* from 2.2
  const char* async_name = torch_names ? "TORCH_NCCL_ASYNC_ERROR_HANDLING" : "NCCL_ASYNC_ERROR_HANDLING";
  const char* async = getenv(async_name);
  if (async != nullptr && std::string(async) == "0") {
    settings.warnings.push_back(str_cat(async_name, "=0: libtorch's NCCL watchdog will not end a job whose "
                                        "collectives hang outside a wait"));
  }
  const bool timed_wait_blocks = torch_major > 2 || (torch_major == 2 && torch_minor >= 6);
  if (!timed_wait_blocks) {
    // Before 2.6, WorkNCCL::wait(timeout) blocks the host only in blocking-wait
    // mode (every version reads NCCL_BLOCKING_WAIT; 2.2+ also TORCH_NCCL_BLOCKING_WAIT).
    const char* blocking = getenv("TORCH_NCCL_BLOCKING_WAIT");
    const char* blocking_name = "TORCH_NCCL_BLOCKING_WAIT";
    if (blocking == nullptr || !torch_names) {
      blocking = getenv("NCCL_BLOCKING_WAIT");
      blocking_name = "NCCL_BLOCKING_WAIT";
    }
    if (blocking == nullptr) {
      settings.env_defaults.emplace_back("NCCL_BLOCKING_WAIT", "1");
    } else if (std::string(blocking) != "1") {
      settings.warnings.push_back(str_cat(blocking_name, "=", blocking, ": on libtorch ", torch_major, ".",
                                          torch_minor, " NCCL waits then return before the collective ends, and "
                                          "a missing rank is found only by the watchdog, without naming it"));
    }
  }
  return settings;
}

c10::intrusive_ptr<C10dGroup> make_nccl(const c10::intrusive_ptr<C10dStore>& store, int rank, int size,
                                        std::chrono::milliseconds timeout) {
#if LOCKSTEP_COMPAT_NCCL
  const NcclWaitSettings settings = nccl_wait_settings(timeout, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, [](const char* name) {
    return static_cast<const char*>(std::getenv(name));
  });
  // ProcessGroupNCCL reads its environment when it is constructed.
  for (const auto& [name, value] : settings.env_defaults) ::setenv(name.c_str(), value.c_str(), /*overwrite=*/0);
  for (const auto& warning : settings.warnings) logger().warn("rank {}: {}", rank, warning);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = settings.watchdog_timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store;
  (void)rank;
  (void)size;
  (void)timeout;
  LOCKSTEP_FAIL("backend 'nccl' is not available: this libtorch (", torch_version(),
                ") was built without CUDA/NCCL; use backend 'gloo'");
#endif
}

}  // namespace lockstep::compat
