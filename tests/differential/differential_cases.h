// The differential suite's cases (tests/differential): for each, the JSON
// both sides train from (pytorch_reference.py reads it; differential_test.cpp
// writes lockstep's YAML from it), lockstep's strategy, and how close the final
// weights must be, with the reason.
//
//   for (const lockstep::differential::DiffCase& c : lockstep::differential::all_cases()) {
//     // train c.reference in PyTorch and through `lockstep train` with c.strategy,
//     // then compare within c.tolerance
//   }
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::differential {

// One comparison: what both sides train, lockstep's strategy, and how close
// the final weights must be (0: bitwise) and why.
struct DiffCase {
  std::string name;
  nlohmann::json reference;
  std::string strategy;
  double tolerance;
  std::string why;
};

// Every case, CPU and GPU ones (a GPU case has "device": "cuda").
const std::vector<DiffCase>& all_cases();

// gtest names a case by its name, not by its bytes (found beside DiffCase).
inline void PrintTo(const DiffCase& c, std::ostream* out) { *out << c.name; }

}  // namespace lockstep::differential
