// dtype_name: the dtype a config names, as PyTorch users write it.
//
//   torch::Dtype dtype = lockstep::parse_dtype("bf16", "model.frozen_dtype");   // torch::kBFloat16
//   lockstep::parse_dtype("int4", "x.yaml:3 model.frozen_dtype");  // Error: x.yaml:3 model.frozen_dtype: unknown dtype 'int4' ...
#pragma once

#include <string>

#include <torch/types.h>

namespace lockstep {

// "fp32"/"float32"/"float", "bf16"/"bfloat16", "fp16"/"float16"/"half",
// "fp64"/"float64"/"double", in any case; anything else is an error naming `where`.
torch::Dtype parse_dtype(const std::string& text, const std::string& where);

}  // namespace lockstep
