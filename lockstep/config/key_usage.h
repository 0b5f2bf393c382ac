// Which keys of a config were read: the checks that turn a typo into an error.
//
// Every read through Config's at()/get()/has()/child() marks the key used.
// After a component has read its part of the config, these name what nobody
// read, with where it was set and the nearest key that was read:
//
//   auto optimizer = cfg.at("optimizer");
//   double lr = optimizer.get<double>("lr");
//   lockstep::check_all_used(optimizer, "SGD");
//   //   "cnn.yaml:14 (key optimizer.momentun): unknown key for SGD (did you
//   //    mean 'momentum'?); it reads: lr, momentum, nesterov, weight_decay"
#pragma once

#include <string>
#include <vector>

#include "lockstep/config/config.h"

namespace lockstep {

// Throws naming every key under `config` (recursively) that was never read,
// e.g. "cnn.yaml:14 (key optimizer.momentun): unknown key for SGD; it reads:
// lr, momentum, nesterov, weight_decay". "It reads" lists the keys looked
// up at that level, present or not. Several unread keys give one error
// headed "N unknown keys for SGD:" with one such line each.
void check_all_used(const Config& config, const std::string& component);

// Throws naming every key of the map `config` that is not in `known`, where
// it was set and the nearest known key: "cnn.yaml:3 (key train): unknown
// top-level key (did you mean 'train_cfg'?); known keys: ...". For maps
// whose keys are read at different times (the top level of a run), where
// check_all_used cannot wait for every reader.
void check_known_keys(const Config& config, const std::vector<std::string>& known, const std::string& component);

// Marks `config` and everything under it as read.
void mark_used(const Config& config);

}  // namespace lockstep
