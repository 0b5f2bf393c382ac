// AutocastGuard: mixed-precision autocast for one region of code (RAII), the
// C++ counterpart of `with torch.autocast(device_type, dtype):`.
//
// Inside the region, ops that gain from lower precision (matmul, linear, conv,
// ...) run in `dtype`; ops that need the range (losses such as cross_entropy,
// mse_loss, nll_loss) run in float32. Elementwise and reduction ops keep their
// inputs' type: on CPU a sum or softmax of a bfloat16 result stays bfloat16
// (CUDA autocast lists them as float32 ops; CPU autocast does not).
//
//   {
//     lockstep::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
//     torch::Tensor logits = model->forward(images);      // bfloat16
//     loss = torch::nn::functional::cross_entropy(logits, labels);  // float32
//   }
//   loss.backward();                                       // outside autocast, as in PyTorch
//
// Guards nest: each restores the enabled flag and dtype it found, and the
// outermost one to exit clears autocast's cache of lower-precision weight
// copies (which would otherwise be stale after the optimizer's step).
// `enabled = false` opens a region that runs in full precision inside an
// autocast one. Autocast state is per thread: destroy the guard on the thread
// that created it. AmpOptimWrapper (amp/amp_optim_wrapper.h) opens one around
// each forward pass.
#pragma once

#include <string>

#include <c10/macros/Macros.h>
#include <torch/types.h>

namespace lockstep {

class AutocastGuard {
 public:
  // CPU supports kBFloat16; CUDA kHalf and kBFloat16. Throws on anything else.
  AutocastGuard(c10::DeviceType device, torch::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  C10_DISABLE_COPY_AND_ASSIGN(AutocastGuard);

  c10::DeviceType device() const { return device_; }

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  torch::ScalarType previous_dtype_;
};

// Whether autocast is on for `device` on this thread, and its dtype.
bool autocast_enabled(c10::DeviceType device);
torch::ScalarType autocast_dtype(c10::DeviceType device);

// Throws (naming `where`, e.g. a config key) unless autocast supports `dtype` on `device`.
void check_autocast_supported(c10::DeviceType device, torch::ScalarType dtype, const std::string& where = "");

}  // namespace lockstep
