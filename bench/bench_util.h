// Small helpers shared by the benchmarks: robust timing statistics and a
// table printer. Benchmarks compare against a baseline measured in the same
// run, alternating the two, because this kind of machine is noisy.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace lockstep::bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// Environment variable as integer, with a default (BENCH_ITERS=200 ...).
inline long env_int(const char* name, long fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtol(value, nullptr, 10) : fallback;
}

}  // namespace lockstep::bench
