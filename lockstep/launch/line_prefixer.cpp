#include "lockstep/launch/line_prefixer.h"

namespace lockstep {

void LinePrefixer::feed(const char* data, size_t size) {
  size_t start = 0;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] != '\n') continue;
    pending_.append(data + start, i - start + 1);
    sink_(prefix_ + pending_);
    pending_.clear();
    start = i + 1;
  }
  pending_.append(data + start, size - start);
  if (pending_.size() > kMaxPending) flush();
}

void LinePrefixer::flush() {
  if (pending_.empty()) return;
  sink_(prefix_ + pending_ + "\n");
  pending_.clear();
}

}  // namespace lockstep
