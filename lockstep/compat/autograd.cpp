#include "lockstep/compat/autograd.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

#include "lockstep/core/error.h"

namespace lockstep::compat {
namespace {

class LambdaPostHook : public torch::autograd::FunctionPostHook {
 public:
  explicit LambdaPostHook(std::function<void()> callback) : callback_(std::move(callback)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    callback_();
    return outputs;
  }

 private:
  std::function<void()> callback_;
};

}  // namespace

NodePtr grad_accumulator(const torch::Tensor& param) {
  LOCKSTEP_CHECK(param.is_leaf() && param.requires_grad(), "a gradient hook needs a leaf tensor that requires grad");
  return torch::autograd::impl::grad_accumulator(param);
}

PostAccumulateHook::PostAccumulateHook(const torch::Tensor& param, std::function<void()> callback)
    : accumulator_(grad_accumulator(param)) {
  key_ = accumulator_->add_post_hook(std::make_unique<LambdaPostHook>(std::move(callback)));
}

PostAccumulateHook::~PostAccumulateHook() {
  if (accumulator_) accumulator_->del_post_hook(key_);
}

void queue_backward_callback(std::function<void()> callback) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
}

std::vector<const torch::autograd::Node*> reachable_nodes(const torch::Tensor& root) {
  std::vector<const torch::autograd::Node*> order;
  if (!root.defined() || !root.grad_fn()) return order;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack{root.grad_fn().get()};
  seen.insert(stack.back());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    order.push_back(node);
    for (const auto& edge : node->next_edges()) {
      torch::autograd::Node* next = edge.function.get();
      if (next != nullptr && seen.insert(next).second) stack.push_back(next);
    }
  }
  return order;
}

}  // namespace lockstep::compat
