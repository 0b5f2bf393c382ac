// TinyMomentum: an optimizer of a test's own, written as a user would write
// one for libtorch (options, a per-parameter state with a tensor and a step,
// save()/load() through libtorch's serialisation macros), for the tests that
// prove lockstep checkpoints, resumes and shards any optimizer.
//
//   auto optimizer = std::make_shared<lockstep::testing::TinyMomentum>(
//       std::vector<torch::optim::OptimizerParamGroup>{{params}}, lockstep::testing::TinyOptions(0.1));
//
// Header-only, so that any test binary can use it without build changes.
#pragma once

#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include "lockstep/compat/internal/optim.h"

namespace lockstep::testing {

namespace optim = torch::optim;

struct TinyOptions : optim::OptimizerCloneableOptions<TinyOptions> {
  using Betas = std::tuple<double, double>;
  TinyOptions(double lr = 0.1) : lr_(lr) {}  // NOLINT: libtorch's load() builds options from a number
  TORCH_ARG(double, lr) = 0.1;
  TORCH_ARG(Betas, betas) = Betas{0.8, 1.0};  // 1.0 must come back a float, not an int

 public:
  void serialize(torch::serialize::InputArchive& archive) override {
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Betas, betas);
  }
  void serialize(torch::serialize::OutputArchive& archive) const override {
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  }
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct TinyParamState : optim::OptimizerCloneableParamState<TinyParamState> {
  TORCH_ARG(torch::Tensor, velocity);
  TORCH_ARG(int64_t, step) = 0;

 public:
  void serialize(torch::serialize::InputArchive& archive) override {
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, velocity);
  }
  void serialize(torch::serialize::OutputArchive& archive) const override {
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(velocity);
  }
};

// The same state without serialize(): nothing can see inside it.
struct TinyBareParamState : optim::OptimizerCloneableParamState<TinyBareParamState> {
  TORCH_ARG(torch::Tensor, velocity);
  TORCH_ARG(int64_t, step) = 0;
};

// Momentum with a step-dependent rate, so that both the buffer and the step
// must come back exactly. Without save()/load(), as libtorch's base class.
template <typename ParamState>
class TinyMomentumBase : public optim::Optimizer {
 public:
  TinyMomentumBase(std::vector<optim::OptimizerParamGroup> groups, TinyOptions defaults)
      : Optimizer(std::move(groups), std::make_unique<TinyOptions>(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups_) {
      const auto& options = static_cast<const TinyOptions&>(group.options());
      for (auto& param : group.params()) {
        if (!param.grad().defined()) continue;
        auto& slot = state_[compat::param_state_key(state_, param)];
        if (!slot) {
          auto fresh = std::make_unique<ParamState>();
          fresh->velocity(torch::zeros_like(param));
          slot = std::move(fresh);
        }
        auto& state = static_cast<ParamState&>(*slot);
        state.step(state.step() + 1);
        state.velocity().mul_(std::get<0>(options.betas())).add_(param.grad(), std::get<1>(options.betas()));
        param.add_(state.velocity(), -options.lr() / static_cast<double>(state.step()));
      }
    }
    return {};
  }
};

// With save()/load() the way libtorch's own optimizers have them (sgd.h).
class TinyMomentum : public TinyMomentumBase<TinyParamState> {
 public:
  using TinyMomentumBase::TinyMomentumBase;
  void save(torch::serialize::OutputArchive& archive) const override { serialize(*this, archive); }
  void load(torch::serialize::InputArchive& archive) override { serialize(*this, archive); }

 private:
  template <typename Self, typename Archive>
  static void serialize(Self& self, Archive& archive) {
    _TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG(Tiny);
  }
};

}  // namespace lockstep::testing
