// LoadReport: what loading named tensors into a model found -- the keys it
// missed, the keys nobody asked for, the ones whose shape differs -- and
// detectron2-style text for them (keys grouped by common prefix).
//
//   lockstep::LoadReport report = strategy.load_model_state_dict(weights, /*strict=*/false, "w.safetensors");
//   if (!report.clean()) logger().warn("{}", report.describe("w.safetensors"));
#pragma once

#include <string>
#include <vector>

namespace lockstep {

struct LoadReport {
  std::vector<std::string> missing;      // in the model, not in the file
  std::vector<std::string> unexpected;   // in the file, not in the model
  std::vector<std::string> mismatched;   // "name: checkpoint [a, b] vs model [c, d]"
  bool clean() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  // detectron2-style text, keys grouped by common prefix.
  std::string describe(const std::string& source) const;
};

}  // namespace lockstep
