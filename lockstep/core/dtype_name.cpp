#include "lockstep/core/dtype_name.h"

#include <algorithm>
#include <cctype>

#include "lockstep/core/error.h"

namespace lockstep {

torch::Dtype parse_dtype(const std::string& text, const std::string& where) {
  std::string key = text;
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
  if (key == "fp32" || key == "float32" || key == "float") return torch::kFloat32;
  if (key == "bf16" || key == "bfloat16") return torch::kBFloat16;
  if (key == "fp16" || key == "float16" || key == "half") return torch::kFloat16;
  if (key == "fp64" || key == "float64" || key == "double") return torch::kFloat64;
  LOCKSTEP_FAIL(where, ": unknown dtype '", text, "' (use fp32, bf16, fp16 or fp64)");
}

}  // namespace lockstep
