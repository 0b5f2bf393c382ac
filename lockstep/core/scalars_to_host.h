// Reads many one-element device tensors to the host with one copy: one
// synchronisation with the GPU instead of one per .item().
//
//   std::map<std::string, torch::Tensor> on_device{{"loss", loss}, {"grad_norm", norm}};
//   std::map<std::string, double> values = lockstep::scalars_to_host(on_device);
#pragma once

#include <map>
#include <string>

#include <torch/types.h>

namespace lockstep {

// Each tensor must hold one element of a real dtype; the values come back as
// doubles, exactly as .item<double>() would give them. An empty map costs nothing.
std::map<std::string, double> scalars_to_host(const std::map<std::string, torch::Tensor>& tensors);

}  // namespace lockstep
