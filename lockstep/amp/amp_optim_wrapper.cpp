#include "lockstep/amp/amp_optim_wrapper.h"

#include <utility>

#include "lockstep/amp/autocast.h"
#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/optim/optim_wrapper_builder.h"

namespace lockstep {

namespace {

c10::DeviceType parameters_device(const torch::optim::Optimizer& optimizer) {
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) return param.device().type();
  }
  return c10::DeviceType::CPU;
}

std::pair<c10::DeviceType, torch::ScalarType> resolve_target(const torch::optim::Optimizer& optimizer,
                                                             const AmpOptions& amp) {
  const c10::DeviceType device = amp.device() ? *amp.device() : parameters_device(optimizer);
  const torch::ScalarType dtype =
      amp.dtype() ? *amp.dtype() : (device == c10::DeviceType::CUDA ? torch::kHalf : torch::kBFloat16);
  return {device, dtype};
}

// The map holding dtype / loss_scale / device: `amp:` when the section has
// one (`optim_wrapper: {amp: {dtype: bf16}}`), else the section itself
// (`optim_wrapper: {type: AmpOptimWrapper, dtype: bf16}`).
Config amp_settings(const Config& config) {
  if (!config.has("amp")) return config;
  for (const char* key : {"dtype", "loss_scale", "device"}) {
    LOCKSTEP_CHECK(!config.has(key), config.where(key), ": put ", key, " inside optim_wrapper.amp, not beside it");
  }
  Config amp = config.at("amp");
  if (amp.is_map()) return amp;
  LOCKSTEP_CHECK(amp.as<bool>(), config.where("amp"), ": amp: false contradicts type: AmpOptimWrapper");
  return Config::map();  // amp: true, defaults
}

}  // namespace

torch::ScalarType parse_amp_dtype(const std::string& text, const std::string& where) {
  if (text == "bf16" || text == "bfloat16") return torch::kBFloat16;
  if (text == "fp16" || text == "float16" || text == "half") return torch::kHalf;
  LOCKSTEP_FAIL(where.empty() ? std::string() : where + ": ", "dtype must be bf16 or fp16, got '", text, "'");
}

AmpOptimWrapper::AmpOptimWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer, OptimWrapperOptions options,
                                 AmpOptions amp)
    : OptimWrapper(std::move(optimizer), options) {
  std::tie(device_, dtype_) = resolve_target(this->optimizer(), amp);
  check_autocast_supported(device_, dtype_);
  if (amp.loss_scale()) {
    scaler_ = std::make_unique<GradScaler>(*amp.loss_scale());
  } else if (dtype_ == torch::kHalf) {
    scaler_ = std::make_unique<GradScaler>();
  }
}

AmpOptimWrapper::~AmpOptimWrapper() = default;

std::function<void()> AmpOptimWrapper::enter_forward_context() {
  // Shared by every copy of the callback, so the first call closes the region
  // whoever still holds a copy.
  auto guard = std::make_shared<std::optional<AutocastGuard>>();
  guard->emplace(device_, dtype_);
  return [guard]() { guard->reset(); };
}

torch::Tensor AmpOptimWrapper::scale_for_backward(const torch::Tensor& loss) {
  return scaler_ ? scaler_->scale(loss) : loss;
}

void AmpOptimWrapper::unscale_gradients() {
  // Once per update: the scale divides the sum of all micro-steps' gradients.
  if (!scaler_ || scaler_->unscaled(optimizer())) return;
  scaler_->unscale_(optimizer(), gradient_sync());
}

bool AmpOptimWrapper::optimizer_step() {
  if (!scaler_) return OptimWrapper::optimizer_step();
  unscale_gradients();
  // The scale this step used, as a tensor: reading it is left to whoever logs it.
  torch::Tensor scale = scaler_->scale_tensor().clone();
  const bool stepped = scaler_->step(optimizer(), gradient_sync());
  scaler_->update();
  last_metrics_["loss_scale"] = scale;
  return stepped;
}

State AmpOptimWrapper::state() const {
  State state = OptimWrapper::state();
  if (scaler_) state.put("grad_scaler", scaler_->state());
  return state;
}

void AmpOptimWrapper::load_state(const State& state) {
  OptimWrapper::load_state(state);
  if (!scaler_) return;
  if (!state.contains("grad_scaler")) {
    logger().warn("the checkpoint holds no grad scaler state (saved without loss scaling?); the loss scale "
                  "starts again from {}", scaler_->options().init_scale());
    return;
  }
  scaler_->load_state(state.get("grad_scaler"));
}

// `amp: {dtype: bf16, ...}` (or `amp: true`) is mixed precision as a switch
// of the plain wrapper; `amp: false` leaves it plain.
namespace {
const bool kAmpSwitchRegistered = [] {
  register_optim_wrapper_switch("amp", [](const Config& amp) -> std::optional<std::string> {
    if (amp.is_map() || amp.as<bool>()) return std::string("AmpOptimWrapper");
    mark_used(amp);
    return std::nullopt;
  });
  return true;
}();
}  // namespace

LOCKSTEP_REGISTER(optim_wrapper_registry(), "AmpOptimWrapper",
                  [](const Config& config, std::shared_ptr<torch::optim::Optimizer> optimizer) {
                    const Config settings = amp_settings(config);
                    AmpOptions amp;
                    if (settings.has("dtype")) {
                      amp.dtype(parse_amp_dtype(settings.get<std::string>("dtype"), settings.where("dtype")));
                    }
                    if (settings.has("loss_scale")) amp.loss_scale(parse_loss_scale(settings.at("loss_scale")));
                    const std::string device = settings.get<std::string>("device", "auto");
                    if (device == "cpu") {
                      amp.device(c10::DeviceType::CPU);
                    } else if (device == "cuda") {
                      amp.device(c10::DeviceType::CUDA);
                    } else {
                      LOCKSTEP_CHECK(device == "auto", settings.where("device"),
                                     ": device must be auto, cpu or cuda, got '", device, "'");
                    }
                    const auto target = resolve_target(*optimizer, amp);
                    check_autocast_supported(target.first, target.second, settings.where("dtype"));
                    return std::make_shared<AmpOptimWrapper>(std::move(optimizer), parse_optim_wrapper_options(config),
                                                             amp);
                  });

}  // namespace lockstep
