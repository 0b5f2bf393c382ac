// Two state dicts (name -> tensor) compared bit for bit, with what differs
// named: the names, each tensor's dtype and shape, then its values.
//
//   EXPECT_TRUE(testing::same_tensors(read_dcp_state_dict(dir), read_pt_state_dict("full.pt")));
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

namespace lockstep::testing {

inline ::testing::AssertionResult same_tensors(const std::map<std::string, torch::Tensor>& got,
                                               const std::map<std::string, torch::Tensor>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " tensors, not " << want.size();
  for (const auto& [name, tensor] : want) {
    auto mine = got.find(name);
    if (mine == got.end()) return ::testing::AssertionFailure() << "no tensor '" << name << "'";
    if (mine->second.scalar_type() != tensor.scalar_type() || mine->second.sizes() != tensor.sizes()) {
      return ::testing::AssertionFailure() << "'" << name << "' is " << mine->second.scalar_type() << " "
                                           << mine->second.sizes() << ", not " << tensor.scalar_type() << " "
                                           << tensor.sizes();
    }
    if (!torch::equal(mine->second, tensor)) return ::testing::AssertionFailure() << "'" << name << "' differs";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace lockstep::testing
