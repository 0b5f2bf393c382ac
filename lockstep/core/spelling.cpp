#include "lockstep/core/spelling.h"

#include <algorithm>
#include <cctype>

namespace lockstep {

size_t edit_distance(const std::string& a, const std::string& b) {
  auto same = [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  };
  // Optimal string alignment: Levenshtein plus the swap of two neighbours ("modle" -> "model": 1).
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
      if (i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::vector<std::string> closest_names(const std::string& name, const std::vector<std::string>& candidates,
                                       size_t limit) {
  struct Scored {
    size_t distance;
    std::string candidate;
  };
  std::vector<Scored> close;
  for (const auto& candidate : candidates) {
    size_t distance = edit_distance(name, candidate);
    // "train" for "train_cfg": a candidate that starts with the name is close
    // however many letters it adds.
    if (name.size() >= 3 && candidate.size() > name.size() && candidate.compare(0, name.size(), name) == 0) {
      distance = std::min<size_t>(distance, 1);
    }
    if (distance * 3 <= std::max(name.size(), candidate.size())) close.push_back({distance, candidate});
  }
  std::stable_sort(close.begin(), close.end(), [](const Scored& a, const Scored& b) {
    return a.distance != b.distance ? a.distance < b.distance : a.candidate.size() < b.candidate.size();
  });
  std::vector<std::string> names;
  for (const auto& scored : close) {
    if (names.size() == limit || scored.distance > close.front().distance) break;
    names.push_back(scored.candidate);
  }
  return names;
}

std::string closest_name(const std::string& name, const std::vector<std::string>& candidates) {
  auto names = closest_names(name, candidates, 1);
  return names.empty() ? std::string() : names.front();
}

std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates) {
  const auto names = closest_names(name, candidates, 3);
  if (names.empty()) return std::string();
  std::string text = " (did you mean '" + names.front() + "'";
  for (size_t i = 1; i < names.size(); ++i) text += (i + 1 == names.size() ? " or '" : ", '") + names[i] + "'";
  return text + "?)";
}

}  // namespace lockstep
