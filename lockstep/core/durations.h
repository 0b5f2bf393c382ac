// Seconds as waits and as text, for code that bounds a wait and names it in
// an error.
//
//   cv.wait_for(lock, lockstep::wait_duration(timeout_s), ready);    // no overflow for huge limits
//   LOCKSTEP_FAIL("waited ", lockstep::seconds_text(lockstep::seconds_since(start)), " s for ...");
#pragma once

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>
#include <string>

namespace lockstep {

// "0.25", "1.5", "12", "1800": seconds as a person reads them.
inline std::string seconds_text(double seconds) {
  std::ostringstream out;
  if (seconds >= 10) {
    out << std::fixed << std::setprecision(0) << seconds;
  } else {
    out << std::setprecision(2) << seconds;
  }
  return out.str();
}

// A wait of `seconds`, clamped so that converting it to the clock's ticks
// cannot overflow (3 years is as good as forever here).
inline std::chrono::nanoseconds wait_duration(double seconds) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(std::min(seconds, 1e8)));
}

// Seconds from `since` to now.
inline double seconds_since(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace lockstep
