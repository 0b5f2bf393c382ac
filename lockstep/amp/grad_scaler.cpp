#include "lockstep/amp/grad_scaler.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/amp/internal/grad_scaler_stage.h"
#include "lockstep/compat/amp_ops.h"
#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/optim/device_side_step.h"
#include "lockstep/optim/gradient_sync.h"

namespace lockstep {

namespace {

void check_options(const GradScalerOptions& options, const std::string& where) {
  const std::string prefix = where.empty() ? std::string() : where + ": ";
  LOCKSTEP_CHECK(std::isfinite(options.init_scale()) && options.init_scale() > 0, prefix,
                 "the loss scale must be a positive finite number, got ", options.init_scale());
  if (!options.dynamic()) return;
  LOCKSTEP_CHECK(options.growth_factor() > 1.0, prefix, "growth_factor must be greater than 1, got ",
                 options.growth_factor());
  LOCKSTEP_CHECK(options.backoff_factor() > 0.0 && options.backoff_factor() < 1.0, prefix,
                 "backoff_factor must lie in (0, 1), got ", options.backoff_factor());
  LOCKSTEP_CHECK(options.growth_interval() >= 1, prefix, "growth_interval must be at least 1, got ",
                 options.growth_interval());
}

// The gradients of `optimizer`, grouped by device and dtype (each fused call
// takes one device; grouping by dtype keeps the fused kernels on their fast path).
std::vector<std::vector<torch::Tensor>> gradient_groups(torch::optim::Optimizer& optimizer) {
  std::vector<std::vector<torch::Tensor>> groups;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      const torch::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      LOCKSTEP_CHECK(!grad.is_sparse(), "GradScaler cannot unscale sparse gradients (a parameter of shape ",
                     param.sizes(), " has one)");
      // As torch.amp.GradScaler: scaled fp16 gradients unscaled in fp16 lose
      // the small values the scale was there to keep.
      LOCKSTEP_CHECK(grad.scalar_type() != torch::kHalf, "GradScaler: attempting to unscale FP16 gradients (a "
                     "parameter of shape ", param.sizes(), " is float16). Keep the parameters in float32 and let "
                     "autocast compute in float16 (optim_wrapper.amp: {dtype: fp16}), or under FSDP use "
                     "mixed_precision: {param_dtype: fp16} (the optimizer then steps float32 shards).");
      bool placed = false;
      for (auto& existing : groups) {
        if (existing.front().device() == grad.device() && existing.front().scalar_type() == grad.scalar_type()) {
          existing.push_back(grad);
          placed = true;
          break;
        }
      }
      if (!placed) groups.push_back({grad});
    }
  }
  return groups;
}

}  // namespace

GradScalerOptions parse_loss_scale(const Config& config) {
  GradScalerOptions options;
  if (config.is_map()) {
    options.init_scale(config.get<double>("init_scale", options.init_scale()))
        .growth_factor(config.get<double>("growth_factor", options.growth_factor()))
        .backoff_factor(config.get<double>("backoff_factor", options.backoff_factor()))
        .growth_interval(config.get<int64_t>("growth_interval", options.growth_interval()));
  } else {
    LOCKSTEP_CHECK(config.is_scalar(), config.where(),
                   ": loss_scale is 'dynamic', a number (a static scale), or a map with init_scale, "
                   "growth_factor, backoff_factor, growth_interval");
    if (config.text() != "dynamic") {
      double value = 0;
      try {
        value = config.as<double>();
      } catch (const Error&) {
        LOCKSTEP_FAIL(config.where(), ": loss_scale must be 'dynamic', a number or a map, got '", config.text(), "'");
      }
      options.init_scale(value).dynamic(false);
    }
  }
  check_options(options, config.where());
  return options;
}

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  if (options_.enabled()) check_options(options_, "");
  scale_ = torch::full({1}, options_.init_scale(), torch::kFloat);
  growth_tracker_ = torch::zeros({1}, torch::kInt);
}

void GradScaler::move_to(const torch::Device& device) {
  if (scale_.device() == device) return;
  scale_ = scale_.to(device);
  growth_tracker_ = growth_tracker_.to(device);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!options_.enabled()) return loss;
  LOCKSTEP_CHECK(loss.defined(), "GradScaler::scale got an undefined tensor");
  move_to(loss.device());
  // scale_ has a dimension, so the product is float32 even for a reduced-precision loss.
  return (loss * scale_).reshape(loss.sizes());
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer, GradientSync* sync) {
  if (!options_.enabled()) return;
  PerOptimizer& entry = per_optimizer_[&optimizer];
  LOCKSTEP_CHECK(entry.stage == Stage::kReady,
                 entry.stage == Stage::kUnscaled
                     ? "GradScaler::unscale_() was already called on this optimizer since the last update()"
                     : "GradScaler::unscale_() called after step(): unscale before stepping, then update()");
  torch::NoGradGuard no_grad;
  // The reciprocal in double, rounded once to float32, as torch.amp does.
  const torch::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  // Found-inf flags stay on the devices (no host sync here, as in torch.amp):
  // one per device the gradients are on, combined on the scale's device.
  torch::Tensor local = torch::zeros({1}, scale_.options());
  for (const auto& grads : gradient_groups(optimizer)) {
    const torch::Device device = grads.front().device();
    torch::Tensor found = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    compat::non_finite_check_and_unscale(grads, found, inv_scale.to(device));
    // Asynchronous only between GPUs: a copy to host memory must land before the host reads it.
    local = torch::maximum(local, found.to(scale_.device(), /*non_blocking=*/scale_.is_cuda()));
  }
  // Every rank asks, whatever it found: the agreement is a collective.
  entry.found_inf = sync != nullptr ? sync->any_rank_true(local) : local;
  move_grad_scaler_stage(entry.stage, Stage::kUnscaled);
}

bool GradScaler::step(torch::optim::Optimizer& optimizer, GradientSync* sync) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  LOCKSTEP_CHECK(per_optimizer_[&optimizer].stage != Stage::kStepped,
                 "GradScaler::step() was already called on this optimizer since the last update()");
  if (per_optimizer_[&optimizer].stage == Stage::kReady) unscale_(optimizer, sync);
  PerOptimizer& entry = per_optimizer_[&optimizer];
  if (DeviceSideStep* device = device_side_step(optimizer); device != nullptr && device->capturable()) {
    // No host read: the optimizer skips on the device (Note [What a captured optimizer step reads]).
    device->stage_host_values();
    device->step_on_device(entry.found_inf);
    move_grad_scaler_stage(entry.stage, Stage::kStepped);
    return true;
  }
  // The one host sync of a step, as torch.amp's GradScaler.step has.
  const bool stepping = entry.found_inf.item<float>() == 0.0f;
  if (stepping) optimizer.step();
  move_grad_scaler_stage(entry.stage, Stage::kStepped);
  return stepping;
}

// The public calls refuse a wrong order with a message for the user; this
// asserts the edges behind those checks.
void move_grad_scaler_stage(GradScaler::Stage& stage, GradScaler::Stage to) {
  using Stage = GradScaler::Stage;
  constexpr unsigned kMayComeFrom[] = {
      0,                                 // ready: only a new entry (update() forgets every optimizer)
      phase_bit(Stage::kReady),          // unscaled
      phase_bit(Stage::kUnscaled),       // stepped: step() unscales first when not yet
  };
  constexpr const char* kNames[] = {"ready", "unscaled", "stepped"};
  move_phase("the GradScaler's stage for an optimizer", stage, to, kMayComeFrom, kNames);
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  torch::Tensor found_inf;
  for (const auto& entry : per_optimizer_) {
    if (entry.second.stage == Stage::kReady) continue;
    found_inf = found_inf.defined() ? torch::maximum(found_inf, entry.second.found_inf) : entry.second.found_inf;
  }
  const bool checked = found_inf.defined();
  LOCKSTEP_CHECK(checked, "GradScaler::update() without an unscale_() or step() since the last update(): "
                 "no gradients were checked for inf/NaN");
  if (options_.dynamic()) {
    compat::update_scale(scale_, growth_tracker_, found_inf, options_.growth_factor(), options_.backoff_factor(),
                         options_.growth_interval());
  }
  per_optimizer_.clear();
}

double GradScaler::get_scale() const { return options_.enabled() ? scale_.item<double>() : 1.0; }

int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

bool GradScaler::found_inf(const torch::optim::Optimizer& optimizer) const {
  auto found = per_optimizer_.find(&optimizer);
  return found != per_optimizer_.end() && found->second.found_inf.defined() &&
         found->second.found_inf.item<float>() != 0.0f;
}

bool GradScaler::unscaled(const torch::optim::Optimizer& optimizer) const {
  auto found = per_optimizer_.find(&optimizer);
  return found != per_optimizer_.end() && found->second.stage == Stage::kUnscaled;
}

State GradScaler::state() const {
  State state;
  state.values["scale"] = get_scale();
  state.values["growth_tracker"] = growth_tracker();
  state.values["growth_factor"] = options_.growth_factor();
  state.values["backoff_factor"] = options_.backoff_factor();
  state.values["growth_interval"] = options_.growth_interval();
  state.values["dynamic"] = options_.dynamic();
  return state;
}

void GradScaler::load_state(const State& state) {
  const auto& values = state.values;
  LOCKSTEP_CHECK(values.is_object() && values.contains("scale") && values.contains("growth_tracker"),
                 "grad scaler state needs 'scale' and 'growth_tracker', got ", values.dump());
  LOCKSTEP_CHECK(values["scale"].is_number() && values["growth_tracker"].is_number_integer(),
                 "grad scaler state: 'scale' must be a number and 'growth_tracker' an integer, got ", values.dump());
  const double scale = values["scale"].get<double>();
  const int64_t tracker = values["growth_tracker"].get<int64_t>();
  LOCKSTEP_CHECK(std::isfinite(scale) && scale > 0, "grad scaler state: scale must be positive and finite, got ", scale);
  LOCKSTEP_CHECK(tracker >= 0, "grad scaler state: growth_tracker must not be negative, got ", tracker);
  // A disabled scaler only remembers; a static one keeps its configured scale.
  if (options_.dynamic()) scale_.fill_(scale);
  growth_tracker_.fill_(tracker);
}

}  // namespace lockstep
