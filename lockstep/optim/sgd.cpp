#include "lockstep/optim/sgd.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "lockstep/compat/internal/optim.h"
#include "lockstep/core/error.h"
#include "lockstep/optim/internal/foreach_groups.h"

namespace lockstep {

// Note [SGD's momentum buffer on the device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Python's SGD makes a parameter's momentum buffer on its first step as a
// copy of the gradient, and from then on decays it. Whether the buffer exists
// is a host fact a graph cannot follow: the first step may be one the loss
// scaler skips, and then the buffer must still not exist at the next. So the
// capturable step makes the buffer (zeros) ahead of time and keeps "made" as
// the step count's device tensor (0 or 1): each step computes both the first
// step's buffer (the gradient) and the decayed one, and torch::where picks
// by the flag. Either value is the plain step's, bit for bit.
//
// A checkpoint saved before any step was taken holds the zero buffer, and a
// run resumed from it decays that buffer: 0 * momentum + gradient, the
// gradient again but for the sign of a zero. That holds only with dampening
// 0, so capturable SGD takes no other (the first step's buffer would be
// (1 - dampening) * gradient instead of the gradient).

torch::Tensor SGD::step(LossClosure closure) {
  return run_step(closure, [this] {
    for (size_t index = 0; index < param_groups().size(); ++index) {
      const std::vector<torch::Tensor> params = params_with_grad(index);
      // foreach operations take no sparse tensors; Python's multi-tensor SGD
      // adds a sparse gradient one tensor at a time, the single-tensor step's
      // arithmetic.
      const bool sparse = std::any_of(params.begin(), params.end(), [](const torch::Tensor& p) {
        return p.grad().is_sparse();
      });
      if (!sparse && steps_foreach(params)) {
        foreach_step(index);
      } else {
        single_tensor_step(index);
      }
    }
  });
}

std::vector<torch::Tensor> SGD::params_with_grad(size_t index) const {
  std::vector<torch::Tensor> params;
  for (const auto& param : param_groups()[index].params()) {
    if (param.grad().defined()) params.push_back(param);
  }
  return params;
}

// Python's _single_tensor_sgd over one group, as libtorch's
// torch::optim::SGD::step does it for every group (Python decides foreach
// group by group, so the step does too).
void SGD::single_tensor_step(size_t index) {
  torch::NoGradGuard no_grad;
  auto& group = param_groups()[index];
  const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
  for (auto& param : group.params()) {
    if (!param.grad().defined()) continue;
    torch::Tensor d_p = param.grad();
    if (options.weight_decay() != 0) d_p = d_p.add(param, options.weight_decay());
    if (options.momentum() != 0) {
      torch::Tensor buffer;
      auto& states = state();
      const auto key = compat::param_state_key(states, param);
      auto found = states.find(key);
      if (found == states.end()) {
        buffer = torch::clone(d_p).detach();
        auto fresh = std::make_unique<torch::optim::SGDParamState>();
        fresh->momentum_buffer(buffer);
        states.emplace(key, std::move(fresh));
      } else {
        buffer = static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
        buffer.mul_(options.momentum()).add_(d_p, 1 - options.dampening());
      }
      d_p = options.nesterov() ? d_p.add(buffer, options.momentum()) : buffer;
    }
    param.add_(d_p, -options.lr());
  }
}

// Python's _multi_tensor_sgd over one group, operation for operation (Note
// [foreach as Python chooses it]): a momentum buffer that does not exist yet
// makes the group's momentum update one tensor at a time, as in Python.
void SGD::foreach_step(size_t index) {
  torch::NoGradGuard no_grad;
  auto& group = param_groups()[index];
  const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
  const std::vector<torch::Tensor> params = params_with_grad(index);
  std::vector<torch::Tensor> grads;
  for (const auto& param : params) {
    grads.push_back(param.grad());
  }
  auto& states = state();
  for (const std::vector<size_t>& part : detail::by_device_and_dtype(params)) {
    std::vector<torch::Tensor> part_params = detail::pick(params, part);
    std::vector<torch::Tensor> part_grads = detail::pick(grads, part);
    if (options.weight_decay() != 0) part_grads = at::_foreach_add(part_grads, part_params, options.weight_decay());
    if (options.momentum() != 0) {
      std::vector<torch::Tensor> buffers;
      bool every_buffer_exists = true;
      for (const auto& param : part_params) {
        auto found = states.find(compat::param_state_key(states, param));
        if (found == states.end()) {
          every_buffer_exists = false;
          break;
        }
        buffers.push_back(static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer());
      }
      if (every_buffer_exists) {
        at::_foreach_mul_(buffers, options.momentum());
        at::_foreach_add_(buffers, part_grads, 1 - options.dampening());
      } else {
        buffers.clear();
        for (size_t i = 0; i < part_params.size(); ++i) {
          const auto key = compat::param_state_key(states, part_params[i]);
          auto found = states.find(key);
          if (found == states.end()) {
            auto fresh = std::make_unique<torch::optim::SGDParamState>();
            fresh->momentum_buffer(torch::clone(part_grads[i]).detach());
            found = states.emplace(key, std::move(fresh)).first;
          } else {
            static_cast<torch::optim::SGDParamState&>(*found->second)
                .momentum_buffer()
                .mul_(options.momentum())
                .add_(part_grads[i], 1 - options.dampening());
          }
          buffers.push_back(static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer());
        }
      }
      // Python adds in place into the gradients it holds (the parameters'
      // own, without weight decay); the values are the same out of place.
      part_grads = options.nesterov() ? at::_foreach_add(part_grads, buffers, options.momentum()) : buffers;
    }
    at::_foreach_add_(part_params, part_grads, -options.lr());
  }
}

void SGD::set_capturable(bool capturable) {
  if (capturable) {
    for (const auto& group : param_groups()) {
      const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
      LOCKSTEP_CHECK(options.dampening() == 0 || options.momentum() == 0,
                     "capturable SGD takes dampening 0 only (got ", options.dampening(),
                     "): its momentum buffers exist from the start, which a nonzero dampening would tell apart "
                     "(Note [SGD's momentum buffer on the device])");
    }
  }
  CapturableOptimizer<torch::optim::SGD>::set_capturable(capturable);
}

void SGD::step_on_device(const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  auto& states = state();
  auto& groups = param_groups();
  for (size_t index = 0; index < groups.size(); ++index) {
    auto& group = groups[index];
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    const torch::Tensor neg_lr = device_values_.lr(index).neg();
    const double momentum = options.momentum();
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      torch::Tensor d_p = param.grad();
      LOCKSTEP_CHECK(!d_p.is_sparse(), "capturable SGD does not take sparse gradients");
      std::vector<torch::Tensor> guarded{param};
      torch::Tensor buffer;
      torch::Tensor made;
      if (momentum != 0) {
        const auto key = compat::param_state_key(states, param);
        auto found = states.find(key);
        const bool in_host_state = found != states.end();
        if (!in_host_state) {
          detail::check_not_capturing("SGD's momentum buffer of a parameter");
          auto fresh = std::make_unique<torch::optim::SGDParamState>();
          fresh->momentum_buffer(torch::zeros_like(param, torch::MemoryFormat::Preserve));
          found = states.emplace(key, std::move(fresh)).first;
        }
        buffer = static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
        // 1 once the buffer holds a first step: the host state's buffer does
        // unless this step made it (Note [SGD's momentum buffer on the device]).
        made = made_flag(param, buffer, in_host_state);
        guarded.push_back(buffer);
        guarded.push_back(made);
      }
      detail::step_unless_found_inf(guarded, found_inf, [&] {
        if (options.weight_decay() != 0) d_p = d_p.add(param, options.weight_decay());
        if (momentum != 0) {
          torch::Tensor decayed = buffer.mul(momentum).add_(d_p, 1 - options.dampening());
          buffer.copy_(torch::where(made != 0, decayed, d_p));
          made.fill_(1);
          d_p = options.nesterov() ? d_p.add(buffer, momentum) : buffer;
        }
        param.addcmul_(d_p, neg_lr);
      });
    }
  }
}

torch::Tensor& SGD::made_flag(const torch::Tensor& param, const torch::Tensor& buffer, bool made_on_host) {
  const void* key = param.unsafeGetTensorImpl();
  const void* owner = buffer.unsafeGetTensorImpl();
  for (auto& entry : made_) {
    if (entry.first != key) continue;
    if (entry.second.buffer != owner) {  // the host state was loaded
      detail::check_not_capturing("SGD's first-step flag of a parameter");
      entry.second.buffer = owner;
      entry.second.made.fill_(made_on_host ? 1.0 : 0.0);
    }
    return entry.second.made;
  }
  detail::check_not_capturing("SGD's first-step flag of a parameter");
  MadeFlag flag;
  flag.buffer = owner;
  flag.made = torch::full({}, made_on_host ? 1.0 : 0.0, param.options().dtype(torch::kFloat));
  made_.emplace_back(key, std::move(flag));
  return made_.back().second.made;
}

// The host state already holds every buffer (Note [SGD's momentum buffer on
// the device]); nothing lives only on the device.
void SGD::sync_host_state() const {}

std::vector<double> SGD::baked_options() const {
  std::vector<double> values;
  for (const auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    values.insert(values.end(), {options.momentum(), options.dampening(), options.weight_decay(),
                                 options.nesterov() ? 1.0 : 0.0});
  }
  return values;
}

}  // namespace lockstep
