// unit_scope: the point where an FSDP unit's forward begins and ends.
//
// libtorch has no forward hooks, so FSDP cannot see a module's forward start
// the way PyTorch's FSDP does. A unit is intercepted in one of two ways:
//
//  1. Automatically, when it is an entry of a torch::nn::Sequential: FSDP
//     puts a thin forwarding entry in its place (Tensor -> Tensor forwards).
//  2. Explicitly, by opening a scope in the module's own forward. This is the
//     way for blocks called through members or ModuleList::as<Block>():
//
//       torch::Tensor BlockImpl::forward(torch::Tensor x) {
//         auto scope = lockstep::fsdp::unit_scope(*this);   // gathers the unit's parameters
//         x = scope.input(x);        // optional; see below
//         x = x + attn(ln1(x));
//         x = x + mlp(ln2(x));
//         return scope.output(x);   // the unit's backward starts with x's gradient
//       }                           // scope closes: FULL_SHARD frees the parameters again
//
// Without FSDP, or for a module that is not a unit, the scope does nothing,
// so model code can open it unconditionally. scope.input(x) marks x as an
// input of the unit: its gradient arriving means the unit's backward is done.
// A unit that holds frozen parameters (FullyShard) needs it to free them as
// soon as its backward is done, as PyTorch's fully_shard does with its
// RegisterPostBackwardFunction: its trainable gradients can all be in while a
// frozen weight is still needed for the gradient of the unit's input (LoRA's
// adapters finish before the frozen layer beside them). Without it such a
// unit stays gathered until the whole backward ends. A Sequential entry's
// input is marked automatically. Every tensor the unit returns
// that needs a gradient must pass through scope.output(); FSDP reports an
// error if a unit's forward never did, since its backward would find the
// parameters freed.
#pragma once

#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace lockstep::fsdp {

namespace detail {
// What a scope calls; implemented by FullyShardedDataParallel.
class UnitRuntime {
 public:
  virtual ~UnitRuntime() = default;
  virtual void enter_unit(int unit) = 0;
  virtual void leave_unit(int unit) noexcept = 0;
  // Hooks `output` for the unit's backward; returns it cast to mp_policy's output_dtype, if any.
  virtual torch::Tensor register_output(int unit, const torch::Tensor& output) = 0;
  virtual void register_input(int unit, const torch::Tensor& input) = 0;
};
// Module -> (runtime, unit index); a module is a unit of at most one FSDP.
void register_unit(const torch::nn::Module* module, UnitRuntime* runtime, int unit);
void unregister_units(const UnitRuntime* runtime);
}  // namespace detail

class UnitScope {
 public:
  UnitScope() = default;  // inactive
  UnitScope(detail::UnitRuntime* runtime, int unit);
  UnitScope(UnitScope&& other) noexcept;
  UnitScope& operator=(UnitScope&&) = delete;
  UnitScope(const UnitScope&) = delete;
  ~UnitScope();

  // Marks `output` as an output of the unit (its gradient starts the unit's
  // backward) and returns it: unchanged, or cast to FullyShard's
  // mp_policy.output_dtype when one is set and the output is floating-point.
  torch::Tensor output(torch::Tensor output);
  std::vector<torch::Tensor> output(std::vector<torch::Tensor> outputs);
  // Marks `input` as an input of the unit (see the top of this file) and returns it unchanged.
  torch::Tensor input(torch::Tensor input);
  bool active() const { return runtime_ != nullptr; }

 private:
  detail::UnitRuntime* runtime_ = nullptr;
  int unit_ = -1;
};

// The scope of `module`'s unit, or an inactive scope when it is none.
UnitScope unit_scope(const torch::nn::Module& module);

}  // namespace lockstep::fsdp
