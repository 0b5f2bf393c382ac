#include "lockstep/core/host_memory_policy.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "tests/support/test_support.h"

namespace lockstep {
namespace {

// What a CPU training step does to the heap: allocate activations of a few
// sizes, write them, free them all. Returns the minor page faults of steps
// 2..steps. (Plain malloc: libtorch's posix_memalign also leaves small
// alignment remainders in glibc's per-thread cache, which pin a few blocks
// in this synthetic order; the demo's own count is in BENCHMARKS.md.)
long faults_over_steps(int steps) {
  const std::vector<size_t> sizes = {6u << 20, 6u << 20, 6u << 20, 3u << 20, 3u << 20, 1u << 20, 12u << 20};
  long faults = 0;
  for (int step = 0; step < steps; ++step) {
    rusage before{};
    getrusage(RUSAGE_SELF, &before);
    std::vector<void*> blocks;
    for (size_t size : sizes) {
      void* block = std::malloc(size);
      if (block == nullptr) std::abort();
      std::memset(block, step + 1, size);
      blocks.push_back(block);
    }
    for (void* block : blocks) std::free(block);
    rusage after{};
    getrusage(RUSAGE_SELF, &after);
    if (step > 0) faults += after.ru_minflt - before.ru_minflt;
  }
  return faults;
}

// Runs in a fresh process (the parent below starts it), so that no earlier
// test has moved glibc's adaptive thresholds.
TEST(HostMemoryPolicyChild, CountsThePageFaultsOfRepeatedSteps) {
  const char* mode = std::getenv("LOCKSTEP_HOST_MEMORY_CHILD");
  if (mode == nullptr) GTEST_SKIP() << "started by HostMemoryPolicy.FreedStepMemoryIsNotFaultedInAgain";
  if (std::string(mode) == "kept") ASSERT_TRUE(keep_freed_host_memory().applied);
  std::printf("page faults over 9 steps: %ld\n", faults_over_steps(10));
}

long child_faults(const std::string& mode) {
  const testing::CommandResult child = testing::run_command(
      {"/proc/self/exe", "--gtest_filter=HostMemoryPolicyChild.CountsThePageFaultsOfRepeatedSteps"},
      {"LOCKSTEP_HOST_MEMORY_CHILD=" + mode}, 120);
  EXPECT_EQ(child.exit_code, 0) << child.output;
  return static_cast<long>(testing::number_after(child.output, "page faults over 9 steps: "));
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kOwnMalloc = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kOwnMalloc = true;
#else
constexpr bool kOwnMalloc = false;
#endif
#else
constexpr bool kOwnMalloc = false;
#endif

TEST(HostMemoryPolicy, FreedStepMemoryIsNotFaultedInAgain) {
  if (kOwnMalloc) GTEST_SKIP() << "AddressSanitizer's allocator replaces glibc's, whose thresholds this sets";
  // 37 MiB a step is about 9,500 pages: glibc's defaults fault most of them in
  // again every step; with the policy, the heap keeps them after the first.
  const long by_default = child_faults("default");
  const long kept = child_faults("kept");
  EXPECT_GT(by_default, 9 * 4000) << "glibc's defaults no longer give the memory back: this test shows nothing";
  EXPECT_LT(kept, 9 * 100);
}

TEST(HostMemoryPolicy, TheUsersOwnMallocTuningWins) {
  const std::string old = std::getenv("MALLOC_TRIM_THRESHOLD_") ? std::getenv("MALLOC_TRIM_THRESHOLD_") : "";
  setenv("MALLOC_TRIM_THRESHOLD_", "1048576", 1);
  const HostMemoryPolicy policy = keep_freed_host_memory();
  if (old.empty()) unsetenv("MALLOC_TRIM_THRESHOLD_"); else setenv("MALLOC_TRIM_THRESHOLD_", old.c_str(), 1);
  EXPECT_FALSE(policy.applied);
  EXPECT_NE(policy.reason.find("MALLOC_TRIM_THRESHOLD_ is set"), std::string::npos) << policy.reason;
}

}  // namespace
}  // namespace lockstep
