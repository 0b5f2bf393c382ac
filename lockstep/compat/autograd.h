// The autograd seam: hooks that run when a parameter's gradient has been
// accumulated, and callbacks at the end of a backward pass, through
// libtorch's private autograd API (torch::autograd::impl, Engine): stable from
// 1.13 to 2.x, but kept here so that a change touches one file.
//
//   lockstep::compat::PostAccumulateHook hook(param, [i] { on_grad_ready(i); });
//   // inside a hook, during backward:
//   lockstep::compat::queue_backward_callback([] { finish_reduction(); });
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include <c10/macros/Macros.h>
#include <torch/torch.h>

namespace torch::autograd {
struct Node;
}

namespace lockstep::compat {

// Runs `callback` after autograd accumulated a new gradient into `param.grad()`
// (a post hook on the parameter's AccumulateGrad node, as PyTorch's reducer
// uses). The hook is removed when this object is destroyed. Keeps the
// accumulator node alive, since the parameter holds it only weakly.
class PostAccumulateHook {
 public:
  PostAccumulateHook(const torch::Tensor& param, std::function<void()> callback);
  ~PostAccumulateHook();
  C10_DISABLE_COPY_AND_ASSIGN(PostAccumulateHook);
  // The AccumulateGrad node (to find the parameter in a traversed graph).
  const torch::autograd::Node* accumulator() const { return accumulator_.get(); }

 private:
  std::shared_ptr<torch::autograd::Node> accumulator_;
  uintptr_t key_ = 0;
};

// The AccumulateGrad node of a leaf that requires grad, creating it if needed.
std::shared_ptr<torch::autograd::Node> grad_accumulator(const torch::Tensor& param);

// Queues `callback` to run when the current backward pass has finished
// (on the thread that called backward). Only valid while autograd is running
// a backward pass on this thread, e.g. from inside a hook.
void queue_backward_callback(std::function<void()> callback);

// Every autograd Node reachable from `root`'s grad_fn (the graph a backward
// from `root` would run), as raw pointers for membership tests.
std::vector<const torch::autograd::Node*> reachable_nodes(const torch::Tensor& root);

}  // namespace lockstep::compat
