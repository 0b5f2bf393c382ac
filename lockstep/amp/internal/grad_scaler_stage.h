// The edges of the GradScaler's per-optimizer stage (GradScaler::Stage):
// ready -> unscaled -> stepped, and back to ready only by update() forgetting
// the optimizer. The public calls check the order first and tell the user;
// this asserts it, so a wrong move is a lockstep bug (InternalError).
//
//   GradScaler::Stage stage = GradScaler::Stage::kReady;
//   move_grad_scaler_stage(stage, GradScaler::Stage::kUnscaled);   // fine
//   move_grad_scaler_stage(stage, GradScaler::Stage::kUnscaled);   // InternalError: "... has no move from
//                                                                  //   unscaled to unscaled"
#pragma once

#include "lockstep/amp/grad_scaler.h"

namespace lockstep {

void move_grad_scaler_stage(GradScaler::Stage& stage, GradScaler::Stage to);

}  // namespace lockstep
