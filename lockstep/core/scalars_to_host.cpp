#include "lockstep/core/scalars_to_host.h"

#include <vector>

#include "lockstep/core/error.h"

namespace lockstep {

std::map<std::string, double> scalars_to_host(const std::map<std::string, torch::Tensor>& tensors) {
  std::map<std::string, double> values;
  if (tensors.empty()) return values;
  const torch::Device device = tensors.begin()->second.device();
  std::vector<torch::Tensor> parts;
  parts.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    LOCKSTEP_CHECK(tensor.defined() && tensor.numel() == 1, "'", name, "' must be one value, got ",
                   tensor.defined() ? tensor.numel() : 0, " elements");
    // float64 holds every float32, float16, bfloat16 and int32 value exactly.
    parts.push_back(tensor.detach().reshape({}).to(device, torch::kDouble));
  }
  const torch::Tensor host = torch::stack(parts).cpu();
  const double* data = host.data_ptr<double>();
  size_t i = 0;
  for (const auto& entry : tensors) values[entry.first] = data[i++];
  return values;
}

}  // namespace lockstep
