// Shapes in messages, as torch prints them.
//
//   LOCKSTEP_CHECK(a.sizes() == b.sizes(), name, ": ", lockstep::shape_text(a), " vs ", lockstep::shape_text(b));
//   // "fc.weight: [3, 4] vs [4, 3]"
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <sstream>
#include <string>

namespace lockstep {

inline std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream text;
  text << sizes;
  return text.str();
}

inline std::string shape_text(const at::Tensor& tensor) {
  return tensor.defined() ? shape_text(tensor.sizes()) : "(undefined)";
}

}  // namespace lockstep
