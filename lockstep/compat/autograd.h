// The autograd seam: hooks that run when a parameter's gradient has been
// accumulated, callbacks at the end of a backward pass, and the pointer
// autograd owns its nodes by, through libtorch's private autograd API
// (torch::autograd::impl, Engine), kept here so that a change touches one
// file: 2.14 holds nodes by c10::intrusive_ptr where 1.13 to 2.13 used
// std::shared_ptr.
//
//   lockstep::compat::PostAccumulateHook hook(param, [i] { on_grad_ready(i); });
//   // inside a hook, during backward:
//   lockstep::compat::queue_backward_callback([] { finish_reduction(); });
//   auto node = lockstep::compat::make_node<MyBackward>();  // then create_gradient_edge(output, node)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include <c10/macros/Macros.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace lockstep::compat {

// The owning pointer to an autograd node, as this libtorch's autograd holds
// them (what grad_fn() and create_gradient_edge take): std::shared_ptr<Node>
// up to 2.13, c10::intrusive_ptr<Node> from 2.14.
using NodePtr = std::decay_t<decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()))>;

// A new node of type T (a torch::autograd::Node), owned the way autograd owns
// nodes: under 1.13-2.13 with autograd's deleteNode (which frees a long chain
// of nodes without deep recursion); under 2.14 intrusively.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
template <class T>
c10::intrusive_ptr<T> make_node() {
  return c10::make_intrusive<T>();
}
#else
template <class T>
std::shared_ptr<T> make_node() {
  return std::shared_ptr<T>(new T(), torch::autograd::deleteNode);
}
#endif

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
  NodePtr accumulator_;
  uintptr_t key_ = 0;
};

// The AccumulateGrad node of a leaf that requires grad, creating it if needed.
NodePtr grad_accumulator(const torch::Tensor& param);

// Queues `callback` to run when the current backward pass has finished
// (on the thread that called backward). Only valid while autograd is running
// a backward pass on this thread, e.g. from inside a hook.
void queue_backward_callback(std::function<void()> callback);

// Every autograd Node reachable from `root`'s grad_fn (the graph a backward
// from `root` would run), as raw pointers for membership tests.
std::vector<const torch::autograd::Node*> reachable_nodes(const torch::Tensor& root);

}  // namespace lockstep::compat
