// The two models of bench/ddp, identical in the C++ and Python runs:
//   cnn: conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, 2x2 max-pool, FC 9216->128, ReLU, FC 128->10 (~1.2M params)
//   mlp: 784->2048->2048->2048->10 with ReLU (~10M params)
#pragma once

#include <memory>
#include <string>

#include "lockstep/core/error.h"
#include "lockstep/models/classifiers.h"

namespace lockstep::bench {

inline std::shared_ptr<ImageClassifier> make_bench_model(const std::string& name) {
  if (name == "cnn") {
    return std::make_shared<ConvNet>(
        ConvNetOptions().channels({32, 64}).hidden(128).batch_norm(false).pooling("after_last"));
  }
  if (name == "mlp") return std::make_shared<MLP>(MLPOptions().hidden({2048, 2048, 2048}));
  LOCKSTEP_FAIL("unknown bench model '", name, "' (cnn or mlp)");
}

}  // namespace lockstep::bench
