// ForeachChoice: whether an optimizer steps a parameter group one tensor at
// a time or all of it at once with multi-tensor ("foreach") operations, as
// PyTorch's `foreach` argument of SGD, Adam and AdamW chooses. Unset, the
// optimizer does what Python's does by default for the libtorch it is built
// against: foreach on a GPU from PyTorch 2.0 on, one tensor at a time on the
// CPU (Note [foreach as Python chooses it]). Both paths compute the same
// update; on a GPU the foreach one launches a few kernels a step where the
// other launches a dozen per parameter, and it is the one whose bits a
// Python run on the GPU has.
//
// lockstep's SGD, Adam and AdamW have it; the YAML key `foreach` (null,
// true or false) of their optimizer section sets it:
//
//   if (lockstep::ForeachChoice* choice = lockstep::foreach_choice(optimizer)) choice->set_foreach(true);
//
// The device-side step (`capturable`, optim/device_side_step.h) is single-tensor
// only: choosing foreach for a capturable optimizer, or the other way round,
// is an error. (Python 2.x's default on a GPU with capturable=True is its
// multi-tensor capturable step, which lockstep does not have yet; the Note
// lists where the defaults still differ.)
#pragma once

#include <optional>

#include <torch/optim/optimizer.h>

#include "lockstep/config/config.h"

namespace lockstep {

class ForeachChoice {
 public:
  virtual ~ForeachChoice() = default;
  // std::nullopt: Python's default for this libtorch and these parameters.
  virtual void set_foreach(std::optional<bool> foreach) = 0;
  virtual std::optional<bool> foreach() const = 0;
};

// The optimizer's choice of path, or null if it has none (libtorch's own
// optimizers step one tensor at a time).
ForeachChoice* foreach_choice(torch::optim::Optimizer& optimizer);

// A config section's `foreach` key (an optimizer's, clip_grad's): absent or
// null is std::nullopt (Python's default), else the boolean, or an error
// naming the key.
std::optional<bool> parse_foreach(const Config& section);

}  // namespace lockstep
