#include "lockstep/optim/adam.h"

#include <cmath>
#include <memory>

#include "lockstep/compat/optim.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// One step of Python's _single_tensor_adam (decoupled_decay false) or
// _single_tensor_adamw (true) over every parameter that has a gradient.
template <typename Options, typename ParamState>
torch::Tensor python_adam_step(torch::optim::Optimizer& optimizer, const torch::optim::Optimizer::LossClosure& closure,
                               bool decoupled_decay) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  auto& states = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    const double lr = options.lr();
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    const double weight_decay = options.weight_decay();
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      torch::Tensor grad = param.grad();
      LOCKSTEP_CHECK(!grad.is_sparse(), "Adam does not support sparse gradients");
      const auto key = compat::param_state_key(states, param);
      auto found = states.find(key);
      if (found == states.end()) {
        auto fresh = std::make_unique<ParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
        if (options.amsgrad()) fresh->max_exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
        found = states.emplace(key, std::move(fresh)).first;
      }
      auto& state = static_cast<ParamState&>(*found->second);
      state.step(state.step() + 1);
      if (decoupled_decay) {
        if (weight_decay != 0) param.mul_(1 - lr * weight_decay);
      } else if (weight_decay != 0) {
        grad = grad.add(param, weight_decay);
      }
      torch::Tensor& exp_avg = state.exp_avg();
      torch::Tensor& exp_avg_sq = state.exp_avg_sq();
      compat::adam_first_moment_(exp_avg, grad, beta1);
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);

      const double step = static_cast<double>(state.step());
      const double bias_correction1 = 1 - std::pow(beta1, step);
      const double bias_correction2 = 1 - std::pow(beta2, step);
      const double step_size = lr / bias_correction1;
      const double bias_correction2_sqrt = compat::adam_bias_correction2_sqrt(bias_correction2);
      torch::Tensor denom;
      if (options.amsgrad()) {
        torch::Tensor& max_exp_avg_sq = state.max_exp_avg_sq();
        // amsgrad turned on after this state was created (Python would fail on the missing key).
        if (!max_exp_avg_sq.defined()) max_exp_avg_sq = torch::zeros_like(param, torch::MemoryFormat::Preserve);
        torch::maximum_out(max_exp_avg_sq, max_exp_avg_sq, exp_avg_sq);
        denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options.eps());
      } else {
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options.eps());
      }
      param.addcdiv_(exp_avg, denom, -step_size);
    }
  }
  return loss;
}

}  // namespace

torch::Tensor Adam::step(LossClosure closure) {
  return python_adam_step<torch::optim::AdamOptions, torch::optim::AdamParamState>(*this, closure,
                                                                                  /*decoupled_decay=*/false);
}

torch::Tensor AdamW::step(LossClosure closure) {
  return python_adam_step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(*this, closure,
                                                                                    /*decoupled_decay=*/true);
}

}  // namespace lockstep
