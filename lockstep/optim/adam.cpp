#include "lockstep/optim/adam.h"

#include <cmath>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "lockstep/compat/internal/optim.h"
#include "lockstep/core/error.h"
#include "lockstep/optim/internal/foreach_groups.h"

namespace lockstep {
namespace {

// The state of `param`, made as Python's Adam makes it on the first step.
template <typename ParamState>
ParamState& adam_state(torch::optim::Optimizer& optimizer, const torch::Tensor& param, bool amsgrad) {
  auto& states = optimizer.state();
  const auto key = compat::param_state_key(states, param);
  auto found = states.find(key);
  if (found == states.end()) {
    detail::check_not_capturing("Adam's state of a parameter");
    auto fresh = std::make_unique<ParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
    if (amsgrad) fresh->max_exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
    found = states.emplace(key, std::move(fresh)).first;
  }
  auto& state = static_cast<ParamState&>(*found->second);
  // amsgrad turned on after this state was created (Python would fail on the missing key).
  if (amsgrad && !state.max_exp_avg_sq().defined()) {
    state.max_exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
  }
  return state;
}

// Calls visit(group index, the group's options, param, its gradient, its
// state) for every parameter of group `index` that has a gradient, without
// autograd, making the state where there is none yet.
template <typename Options, typename ParamState, typename Visit>
void for_each_adam_param_of(torch::optim::Optimizer& optimizer, size_t index, const Visit& visit) {
  torch::NoGradGuard no_grad;
  auto& group = optimizer.param_groups()[index];
  const auto& options = static_cast<const Options&>(group.options());
  for (auto& param : group.params()) {
    if (!param.grad().defined()) continue;
    LOCKSTEP_CHECK(!param.grad().is_sparse(), "Adam does not support sparse gradients");
    visit(index, options, param, param.grad(), adam_state<ParamState>(optimizer, param, options.amsgrad()));
  }
}

// ... for every group.
template <typename Options, typename ParamState, typename Visit>
void for_each_adam_param(torch::optim::Optimizer& optimizer, const Visit& visit) {
  for (size_t index = 0; index < optimizer.param_groups().size(); ++index) {
    for_each_adam_param_of<Options, ParamState>(optimizer, index, visit);
  }
}

// The parameters of group `index` that have a gradient.
std::vector<torch::Tensor> params_with_grad(const torch::optim::Optimizer& optimizer, size_t index) {
  std::vector<torch::Tensor> params;
  for (const auto& param : optimizer.param_groups()[index].params()) {
    if (param.grad().defined()) params.push_back(param);
  }
  return params;
}

// One step of Python's _single_tensor_adam (decoupled_decay false) or
// _single_tensor_adamw (true) over group `index`'s parameters that have a gradient.
template <typename Options, typename ParamState>
void python_adam_step(torch::optim::Optimizer& optimizer, size_t group_index, bool decoupled_decay) {
  for_each_adam_param_of<Options, ParamState>(optimizer, group_index, [&](size_t, const Options& options,
                                                                           torch::Tensor& param, torch::Tensor grad,
                                                                           ParamState& state) {
    const double lr = options.lr();
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    state.step(state.step() + 1);
    if (decoupled_decay) {
      if (options.weight_decay() != 0) param.mul_(1 - lr * options.weight_decay());
    } else if (options.weight_decay() != 0) {
      grad = grad.add(param, options.weight_decay());
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
      torch::maximum_out(max_exp_avg_sq, max_exp_avg_sq, exp_avg_sq);
      denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options.eps());
    } else {
      denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options.eps());
    }
    param.addcdiv_(exp_avg, denom, -step_size);
  });
}

// One step of Python's _multi_tensor_adam (decoupled_decay false) or
// _multi_tensor_adamw (true) over group `index`'s parameters that have a
// gradient: the same update as python_adam_step, each operation once for
// all the parameters of one device and dtype (Note [foreach as Python
// chooses it]). The bias corrections are host numbers per parameter, as in
// Python's non-capturable path.
template <typename Options, typename ParamState>
void python_adam_foreach_step(torch::optim::Optimizer& optimizer, size_t group_index, bool decoupled_decay) {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<ParamState*> states;
  const Options* group_options = nullptr;
  for_each_adam_param_of<Options, ParamState>(optimizer, group_index, [&](size_t, const Options& options,
                                                                           torch::Tensor& param, torch::Tensor grad,
                                                                           ParamState& state) {
    group_options = &options;
    params.push_back(param);
    grads.push_back(grad);
    exp_avgs.push_back(state.exp_avg());
    exp_avg_sqs.push_back(state.exp_avg_sq());
    if (options.amsgrad()) max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
    states.push_back(&state);
  });
  if (params.empty()) return;
  const Options& options = *group_options;
  const double lr = options.lr();
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  torch::NoGradGuard no_grad;
  for (const std::vector<size_t>& part : detail::by_device_and_dtype(params)) {
    std::vector<torch::Tensor> part_params = detail::pick(params, part);
    std::vector<torch::Tensor> part_grads = detail::pick(grads, part);
    std::vector<torch::Tensor> part_exp_avgs = detail::pick(exp_avgs, part);
    std::vector<torch::Tensor> part_exp_avg_sqs = detail::pick(exp_avg_sqs, part);
    for (size_t i : part) states[i]->step(states[i]->step() + 1);
    if (decoupled_decay) {
      if (options.weight_decay() != 0) at::_foreach_mul_(part_params, 1 - lr * options.weight_decay());
    } else if (options.weight_decay() != 0) {
      part_grads = at::_foreach_add(part_grads, part_params, options.weight_decay());
    }
    compat::foreach_adam_first_moment_(part_exp_avgs, part_grads, beta1);
    at::_foreach_mul_(part_exp_avg_sqs, beta2);
    at::_foreach_addcmul_(part_exp_avg_sqs, part_grads, part_grads, 1 - beta2);

    std::vector<c10::Scalar> step_sizes, bias_corrections2_sqrt;
    for (size_t i : part) {
      const double step = static_cast<double>(states[i]->step());
      step_sizes.emplace_back((lr / (1 - std::pow(beta1, step))) * -1);
      bias_corrections2_sqrt.emplace_back(compat::adam_bias_correction2_sqrt(1 - std::pow(beta2, step)));
    }
    std::vector<torch::Tensor> denom;
    if (options.amsgrad()) {
      std::vector<torch::Tensor> part_max = detail::pick(max_exp_avg_sqs, part);
      at::_foreach_maximum_(part_max, part_exp_avg_sqs);
      denom = at::_foreach_sqrt(part_max);
    } else {
      denom = at::_foreach_sqrt(part_exp_avg_sqs);
    }
    at::_foreach_div_(denom, bias_corrections2_sqrt);
    at::_foreach_add_(denom, options.eps());
    at::_foreach_addcdiv_(part_params, part_exp_avgs, denom, step_sizes);
  }
}

// Python's capturable single-tensor path, operation for operation (Python's
// `scalar / tensor` is tensor.reciprocal() * scalar and `1 - tensor` is
// rsub), with the learning rate a float64 tensor where Python has a float
// (Note [What a captured optimizer step reads]). Issues device work only once
// every state exists.
template <typename Options, typename ParamState>
void capturable_adam_step(torch::optim::Optimizer& optimizer, detail::DeviceValues& values,
                          const torch::Tensor& found_inf, bool decoupled_decay) {
  for_each_adam_param<Options, ParamState>(optimizer, [&](size_t index, const Options& options,
                                                          torch::Tensor& param, torch::Tensor grad,
                                                          ParamState& state) {
    const torch::Tensor& lr = values.lr(index);
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    torch::Tensor& step = values.step(param, state.step(), state.exp_avg());
    torch::Tensor& exp_avg = state.exp_avg();
    torch::Tensor& exp_avg_sq = state.exp_avg_sq();
    std::vector<torch::Tensor> guarded{param, exp_avg, exp_avg_sq, step};
    if (options.amsgrad()) guarded.push_back(state.max_exp_avg_sq());
    detail::step_unless_found_inf(guarded, found_inf, [&] {
      step.add_(1);
      if (decoupled_decay) {
        if (options.weight_decay() != 0) param.mul_(torch::rsub(lr * options.weight_decay(), 1));
      } else if (options.weight_decay() != 0) {
        grad = grad.add(param, options.weight_decay());
      }
      compat::adam_first_moment_(exp_avg, grad, beta1);
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      const torch::Tensor bias_correction1 = torch::rsub(torch::pow(beta1, step), 1);
      const torch::Tensor bias_correction2 = torch::rsub(torch::pow(beta2, step), 1);
      const torch::Tensor step_size_neg = (bias_correction1.reciprocal() * values.lr_float(index)).neg();
      const torch::Tensor bias_correction2_sqrt = bias_correction2.sqrt();
      const torch::Tensor second = options.amsgrad()
                                       ? torch::maximum_out(state.max_exp_avg_sq(), state.max_exp_avg_sq(), exp_avg_sq)
                                       : exp_avg_sq;
      torch::Tensor denom =
          (second.sqrt() / (bias_correction2_sqrt * step_size_neg)).add_(step_size_neg.reciprocal() * options.eps());
      param.addcdiv_(exp_avg, denom);
    });
  });
}

template <typename Options>
std::vector<double> adam_baked_options(const torch::optim::Optimizer& optimizer) {
  std::vector<double> values;
  for (const auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    values.insert(values.end(), {std::get<0>(options.betas()), std::get<1>(options.betas()), options.eps(),
                                 options.weight_decay(), options.amsgrad() ? 1.0 : 0.0});
  }
  return values;
}

// Writes each parameter's device step count into its host state.
template <typename ParamState>
void sync_step_counts(const torch::optim::Optimizer& optimizer, detail::DeviceValues& values) {
  auto& states = const_cast<torch::optim::Optimizer&>(optimizer).state();
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      auto found = states.find(compat::param_state_key(states, param));
      if (found == states.end()) continue;
      auto& state = static_cast<ParamState&>(*found->second);
      state.step(values.step(param, state.step(), state.exp_avg()).template item<int64_t>());
    }
  }
}

}  // namespace

template <typename Base, typename Options, typename ParamState, bool kDecoupledDecay>
torch::Tensor PythonAdam<Base, Options, ParamState, kDecoupledDecay>::step(
    torch::optim::Optimizer::LossClosure closure) {
  return this->run_step(closure, [this] {
    for (size_t index = 0; index < this->param_groups().size(); ++index) {
      if (this->steps_foreach(params_with_grad(*this, index))) {
        python_adam_foreach_step<Options, ParamState>(*this, index, kDecoupledDecay);
      } else {
        python_adam_step<Options, ParamState>(*this, index, kDecoupledDecay);
      }
    }
  });
}

template <typename Base, typename Options, typename ParamState, bool kDecoupledDecay>
void PythonAdam<Base, Options, ParamState, kDecoupledDecay>::step_on_device(const torch::Tensor& found_inf) {
  capturable_adam_step<Options, ParamState>(*this, this->device_values_, found_inf, kDecoupledDecay);
}

template <typename Base, typename Options, typename ParamState, bool kDecoupledDecay>
void PythonAdam<Base, Options, ParamState, kDecoupledDecay>::sync_host_state() const {
  sync_step_counts<ParamState>(*this, this->device_values_);
}

template <typename Base, typename Options, typename ParamState, bool kDecoupledDecay>
std::vector<double> PythonAdam<Base, Options, ParamState, kDecoupledDecay>::baked_options() const {
  return adam_baked_options<Options>(*this);
}

template class PythonAdam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, false>;
template class PythonAdam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>;

}  // namespace lockstep
