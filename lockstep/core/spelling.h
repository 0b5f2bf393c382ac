// closest_name: the suggestion in "unknown key 'train.max_iters'; did you mean
// 'train_cfg'?". Edit distance (with swaps, case-insensitive) picks the
// nearest candidate; nothing is suggested when even the nearest is far off.
//
//   closest_name("trian_cfg", {"train_cfg", "val_cfg"});   // "train_cfg"
//   did_you_mean("train", {"train_cfg", "trainer"});         // " (did you mean 'trainer' or 'train_cfg'?)"
//   closest_name("foo", {"train_cfg", "model"});           // "" (nothing close)
//   known_names(wrappers_);                                  // "discriminator, generator"
#pragma once

#include <string>
#include <vector>

namespace lockstep {

// Insertions, deletions, substitutions and swaps of neighbours that turn `a`
// into `b`, ignoring case.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidates nearest to `name`, nearest first (ties: shorter first), at
// most `limit`: those at the smallest distance, when that distance is at most
// a third of the longer word ("foo" suggests nothing). A candidate that
// `name` begins (3 letters or more: "train" for "train_cfg") counts as one
// edit away.
std::vector<std::string> closest_names(const std::string& name, const std::vector<std::string>& candidates,
                                       size_t limit);
// The first of closest_names, or "".
std::string closest_name(const std::string& name, const std::vector<std::string>& candidates);

// " (did you mean 'X'?)", " (did you mean 'X', 'Y' or 'Z'?)", or "" when nothing is close.
std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates);

// The keys of `map`, comma-separated, for a message that lists what is known.
template <typename Map>
std::string known_names(const Map& map) {
  std::string names;
  for (const auto& entry : map) names += (names.empty() ? "" : ", ") + std::string(entry.first);
  return names;
}

}  // namespace lockstep
