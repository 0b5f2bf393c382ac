#include "lockstep/hooks/ema_hook.h"

#include <torch/torch.h>

#include "lockstep/checkpoint/internal/ema_state_keys.h"
#include "lockstep/core/error.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/model/model.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {

EMAHook::EMAHook(EMAOptions options, Sources parameters, StateCodec codec)
    : Hook("EMAHook"), options_(options), parameters_(std::move(parameters)), codec_(std::move(codec)) {
  LOCKSTEP_CHECK(options_.momentum() > 0 && options_.momentum() < 1, "EMAHook: momentum must be in (0, 1), got ",
                 options_.momentum());
  LOCKSTEP_CHECK(options_.interval() >= 1, "EMAHook: interval must be at least 1, got ", options_.interval());
  LOCKSTEP_CHECK(options_.begin_iter() >= 0, "EMAHook: begin_iter must be non-negative, got ", options_.begin_iter());
}

std::map<std::string, torch::Tensor> EMAHook::averaged_sources() const {
  std::map<std::string, torch::Tensor> sources;
  Model& model = trainer().model();
  if (parameters_) {
    for (const auto& [name, tensor] : parameters_()) sources[ema_keys::kParameter + name] = tensor;
  } else {
    for (const auto& item : model.named_parameters()) sources[ema_keys::kParameter + item.key()] = item.value();
  }
  if (options_.update_buffers()) {
    for (const auto& item : model.named_buffers()) sources[ema_keys::kBuffer + item.key()] = item.value();
  }
  return sources;
}

std::map<std::string, torch::Tensor> EMAHook::copied_sources() const {
  std::map<std::string, torch::Tensor> sources;
  if (!options_.update_buffers()) {
    for (const auto& item : trainer().model().named_buffers()) {
      sources[ema_keys::kBuffer + item.key()] = item.value();
    }
  }
  return sources;
}

void EMAHook::ensure_average() {
  if (!average_.empty()) return;
  torch::NoGradGuard no_grad;
  for (const auto& [name, source] : averaged_sources()) average_[name] = source.detach().clone();
  for (const auto& [name, source] : copied_sources()) average_[name] = source.detach().clone();
}

void EMAHook::before_train() { ensure_average(); }

void EMAHook::copy_from_model() {
  torch::NoGradGuard no_grad;
  for (const auto& [name, source] : averaged_sources()) average_.at(name).copy_(source);
  for (const auto& [name, source] : copied_sources()) average_.at(name).copy_(source);
}

// mmengine's BaseAveragedModel.update_parameters with ExponentialMovingAverage's avg_func.
void EMAHook::update() {
  torch::NoGradGuard no_grad;
  if (steps_ == 0) {
    for (const auto& [name, source] : averaged_sources()) average_.at(name).copy_(source);
  } else if (steps_ % options_.interval() == 0) {
    for (const auto& [name, source] : averaged_sources()) {
      torch::Tensor& average = average_.at(name);
      if (average.is_floating_point()) average.lerp_(source.to(average.device()), options_.momentum());
    }
  }
  for (const auto& [name, source] : copied_sources()) average_.at(name).copy_(source);
  ++steps_;
}

void EMAHook::after_step() {
  ensure_average();
  if (trainer().iter() + 1 >= options_.begin_iter()) {
    update();
  } else {
    copy_from_model();
  }
}

void EMAHook::swap() {
  if (average_.empty()) return;  // evaluation before any training
  torch::NoGradGuard no_grad;
  for (const auto& [name, source] : averaged_sources()) {
    torch::Tensor held = source.detach().clone();
    source.copy_(average_.at(name));
    average_.at(name).copy_(held);
  }
  swapped_ = !swapped_;
  if (after_swap_) after_swap_();
}

State EMAHook::state() const {
  LOCKSTEP_CHECK(!swapped_, "EMAHook: a checkpoint was asked for while the average is swapped in (inside an evaluation)");
  if (codec_.save) {
    State state = codec_.save(average_);
    state.values["steps"] = steps_;
    return state;
  }
  State state;
  for (const auto& [name, tensor] : average_) state.tensors[name] = tensor;
  state.values["steps"] = steps_;
  return state;
}

void EMAHook::load_state(const State& state) {
  ensure_average();
  torch::NoGradGuard no_grad;
  if (codec_.load) {
    codec_.load(state, average_);
    steps_ = state.values.at("steps").get<int64_t>();
    return;
  }
  for (auto& [name, tensor] : average_) {
    const torch::Tensor& saved = state.tensor(name, "EMAHook state");
    LOCKSTEP_CHECK(saved.sizes() == tensor.sizes(), "EMAHook state: '", name, "' has shape ", saved.sizes(),
                   " but the model's has ", tensor.sizes());
    tensor.copy_(saved);
  }
  steps_ = state.values.at("steps").get<int64_t>();
}

LOCKSTEP_REGISTER(hook_registry(), "EMAHook", [](const Config& cfg, const HookContext& context) {
  EMAOptions options;
  options.momentum(cfg.get<double>("momentum", 0.0002))
      .interval(cfg.get<int64_t>("interval", 1))
      .begin_iter(cfg.get<int64_t>("begin_iter", 0))
      .update_buffers(cfg.get<bool>("update_buffers", false));
  LOCKSTEP_CHECK(options.momentum() > 0 && options.momentum() < 1, cfg.where("momentum"),
                 ": momentum must be in (0, 1), got ", options.momentum());
  LOCKSTEP_CHECK(options.interval() >= 1, cfg.where("interval"), ": interval must be at least 1");
  LOCKSTEP_CHECK(options.begin_iter() >= 0, cfg.where("begin_iter"), ": begin_iter must be non-negative");
  Strategy::WeightAveraging averaging;
  if (context.strategy) averaging = context.strategy->weight_averaging();
  auto hook = std::make_shared<EMAHook>(options, averaging.stepped_parameters,
                                        EMAHook::StateCodec{averaging.save, averaging.load});
  if (averaging.after_swap) hook->set_after_swap(averaging.after_swap);
  return hook;
});

}  // namespace lockstep
