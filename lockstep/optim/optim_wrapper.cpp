#include "lockstep/optim/optim_wrapper.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cmath>

#include "lockstep/compat/internal/optim.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/scalars_to_host.h"
#include "lockstep/core/spelling.h"
#include "lockstep/optim/device_side_step.h"
#include "lockstep/optim/internal/foreach_groups.h"
#include "lockstep/optim/optimizer_state.h"
#include "lockstep/optim/param_groups.h"

namespace lockstep {

OptimWrapperBase::StepScope::StepScope(StepScope&& other) noexcept : wrapper_(other.wrapper_) { other.wrapper_ = nullptr; }

OptimWrapperBase::StepScope::~StepScope() {
  if (wrapper_) wrapper_->close_step();
}

OptimWrapperBase::StepScope OptimWrapperBase::begin_step(const StepContext& context) {
  open_step(&context);
  return StepScope(this);
}

namespace {

// GradientSync::step_failed, once per step.
void report_failure(StepProgress& progress, GradientSync* sync, const std::exception_ptr& error, bool synchronised,
                    int64_t iteration) {
  bool reduced = false;
  if (sync == nullptr || !progress.fail(reduced)) return;
  sync->step_failed(error, reduced, synchronised, iteration);
}

// The param group whose lr is reported (the one with the most elements).
size_t main_param_group(const torch::optim::Optimizer& optimizer) {
  size_t best = 0;
  int64_t best_count = -1;
  const auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    int64_t count = 0;
    for (const auto& p : groups[i].params()) count += p.numel();
    if (count > best_count) {
      best_count = count;
      best = i;
    }
  }
  return best;
}

}  // namespace

void OptimWrapper::abandon_step(const std::exception_ptr& error) {
  report_failure(progress_, gradient_sync_.get(), error, accumulation_.should_sync(),
                 progress_.iteration(accumulation_.inner_count()));
}

void check_optim_wrapper_options(const OptimWrapperOptions& options,
                                 const std::function<std::string(const std::string& key)>& where) {
  LOCKSTEP_CHECK(options.accumulative_counts() >= 1, where("accumulative_counts"),
                 ": accumulative_counts must be at least 1, got ", options.accumulative_counts());
  const auto& clip = options.clip_grad();
  if (clip.kind == ClipGradOptions::Kind::kNorm || clip.kind == ClipGradOptions::Kind::kNormPerParameter) {
    LOCKSTEP_CHECK(clip.max_norm > 0, where("clip_grad.max_norm"), ": max_norm must be positive, got ", clip.max_norm);
    LOCKSTEP_CHECK(clip.norm_type > 0, where("clip_grad.norm_type"), ": norm_type must be positive");
  } else if (clip.kind == ClipGradOptions::Kind::kValue) {
    LOCKSTEP_CHECK(clip.clip_value > 0, where("clip_grad.clip_value"), ": clip_value must be positive, got ",
                   clip.clip_value);
  }
}

namespace {

const OptimWrapperOptions& checked(const OptimWrapperOptions& options) {
  check_optim_wrapper_options(options, [](const std::string& key) { return "OptimWrapperOptions " + key; });
  return options;
}

}  // namespace

OptimWrapper::OptimWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer, OptimWrapperOptions options)
    : optimizer_(std::move(optimizer)), options_(checked(options)), accumulation_(options_.accumulative_counts()) {
  LOCKSTEP_CHECK(optimizer_ != nullptr, "OptimWrapper needs an optimizer");
}

OptimWrapper::~OptimWrapper() = default;

void OptimWrapper::set_gradient_sync(std::shared_ptr<GradientSync> sync) {
  LOCKSTEP_CHECK(sync == nullptr || sync->holds_whole_gradients() ||
                     options_.clip_grad().kind != ClipGradOptions::Kind::kNormPerParameter,
                 "clip_grad type norm_per_parameter clips each parameter against its own norm, and this strategy "
                 "shards the gradients (FSDP): a parameter's norm would need a collective of its own per parameter "
                 "and step. Use clip_grad's global norm (type: norm) or value clipping, or DDPStrategy");
  gradient_sync_ = std::move(sync);
}

OptimWrapper::Context::Context(std::function<void()> on_exit) : on_exit_(std::move(on_exit)) {}
OptimWrapper::Context::Context(Context&& other) noexcept : on_exit_(std::move(other.on_exit_)) {
  other.on_exit_ = nullptr;
}
OptimWrapper::Context::~Context() {
  if (on_exit_) on_exit_();
}

OptimWrapper::Context OptimWrapper::optim_context() {
  LOCKSTEP_CHECK(!forward_context_open_, "optim_context() entered twice: close the first context "
                 "(it must cover exactly one forward pass) before opening another");
  if (gradient_sync_) gradient_sync_->begin_forward(accumulation_.should_sync());
  std::function<void()> leave_autocast = enter_forward_context();
  forward_context_open_ = true;
  return Context([this, leave_autocast]() {
    forward_context_open_ = false;
    if (leave_autocast) leave_autocast();
  });
}

void OptimWrapper::initialize_count_status(int64_t start_iter, int64_t max_iters) {
  accumulation_.start(start_iter, max_iters);
}

torch::Tensor OptimWrapper::scale_loss(const torch::Tensor& loss) const {
  const int64_t factor = accumulation_.loss_divisor();
  return factor == 1 ? loss : loss / static_cast<double>(factor);
}

void OptimWrapper::count_replayed_backward() {
  if (accumulation_.should_sync()) progress_.mark_reduced();
  accumulation_.count();
}

void OptimWrapper::backward(const torch::Tensor& loss) {
  LOCKSTEP_CHECK(loss.defined() && loss.numel() == 1, "update_params needs a scalar loss, got a tensor of shape ",
                 loss.defined() ? loss.sizes() : c10::IntArrayRef{});
  LOCKSTEP_CHECK(loss.requires_grad(), "the loss does not require grad: no parameter took part in computing it "
                 "(was the forward run under torch::NoGradGuard, or are all parameters frozen?)");
  const bool sync = accumulation_.should_sync();
  progress_.begin_backward();
  const int64_t iteration = progress_.iteration(accumulation_.inner_count());
  torch::Tensor to_differentiate = stop_after_nonfinite_loss_
                                       ? guard_nonfinite_loss(loss, scale_for_backward(loss), iteration)
                                       : scale_for_backward(loss);
  try {
    {
      RECORD_USER_SCOPE("lockstep::backward");
      if (gradient_sync_) gradient_sync_->begin_backward(to_differentiate, sync, iteration);
      to_differentiate.backward();
    }
    if (gradient_sync_) {
      RECORD_USER_SCOPE("lockstep::wait_for_communication");
      gradient_sync_->end_backward(sync);
    }
  } catch (...) {
    // The gradient sync may replace the error with the one every rank agrees on.
    report_failure(progress_, gradient_sync_.get(), std::current_exception(), sync, iteration);
    throw;
  }
  if (sync) progress_.mark_reduced();
  accumulation_.count();
  const StepContext* step = progress_.context();
  if (step != nullptr && step->after_backward) step->after_backward();
}

void OptimWrapper::update_params(const torch::Tensor& loss) {
  backward(scale_loss(loss));
  if (accumulation_.should_update()) {
    RECORD_USER_SCOPE("lockstep::optimizer_step");
    step();
    zero_grad();
  }
}

std::vector<torch::Tensor> OptimWrapper::parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer_->param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

namespace {

// Norm clipping as torch.nn.utils.clip_grad_norm_, operation for operation
// (the same bits as PyTorch's): the norm of the per-tensor norms, in the
// gradients' dtype, and every gradient multiplied by the clamped
// coefficient; by foreach operations over each device and dtype where
// Python takes them (Note [foreach as Python chooses it]). Sharded
// gradients (FSDP) combine their norms through the GradientSync, as
// PyTorch's FSDP.clip_grad_norm_ does, one gradient at a time. Returns the
// total norm.
torch::Tensor clip_by_norm(const std::vector<torch::Tensor>& grads, const ClipGradOptions& clip, GradientSync* sync) {
  torch::NoGradGuard no_grad;
  const bool foreach = (sync == nullptr || !sync->clips_one_gradient_at_a_time()) &&
                       clip.foreach.value_or(compat::clip_foreach_by_default());
  const std::vector<std::vector<size_t>> parts = detail::by_device_and_dtype(grads);
  torch::Tensor total;
  if (grads.empty()) {
    total = torch::zeros({}, torch::kFloat);
  } else {
    std::vector<torch::Tensor> norms;
    norms.reserve(grads.size());
    if (foreach) {
      for (const auto& part : parts) {
        for (auto& norm : at::_foreach_norm(detail::pick(grads, part), clip.norm_type)) norms.push_back(norm);
      }
    } else {
      for (const auto& g : grads) norms.push_back(torch::norm(g.detach(), clip.norm_type));
    }
    for (auto& norm : norms) norm = norm.to(norms.front().device());
    total = torch::norm(torch::stack(norms), clip.norm_type);
  }
  if (sync != nullptr) total = sync->reduce_grad_norm(total, clip.norm_type);
  // Python's `max_norm / tensor` is tensor.reciprocal() * max_norm (two roundings, unlike C++'s division).
  torch::Tensor coefficient = torch::clamp((total + 1e-6).reciprocal() * clip.max_norm, c10::nullopt, 1.0);
  if (foreach) {
    for (const auto& part : parts) {
      compat::foreach_mul_(detail::pick(grads, part), coefficient.to(grads[part.front()].device()));
    }
  } else {
    for (auto& g : grads) g.mul_(coefficient.to(g.device()));
  }
  return total;
}

// Clips the gradients of `params` as `clip` says; the global norm clip
// records the norm in `metrics` ("grad_norm").
void clip_gradients(const std::vector<torch::Tensor>& params, const ClipGradOptions& clip, GradientSync* sync,
                    std::map<std::string, torch::Tensor>& metrics) {
  if (clip.kind == ClipGradOptions::Kind::kNone) return;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    // Empty ones hold nothing to clip (FSDP's use_orig_params gives a
    // parameter held wholly by other ranks an empty part here), and the
    // infinity norm of an empty tensor is an error.
    if (p.grad().defined() && p.grad().numel() > 0) grads.push_back(p.grad());
  }
  switch (clip.kind) {
    case ClipGradOptions::Kind::kValue:
      for (auto& g : grads) g.clamp_(-clip.clip_value, clip.clip_value);
      return;
    case ClipGradOptions::Kind::kNormPerParameter:
      // detectron2's per-parameter clipper: clip_grad_norm_(p) for every
      // parameter of every group; whole gradients only (set_gradient_sync).
      for (const auto& g : grads) clip_by_norm({g}, clip, nullptr);
      return;
    case ClipGradOptions::Kind::kNorm:
      metrics["grad_norm"] = clip_by_norm(grads, clip, sync).detach();
      return;
    case ClipGradOptions::Kind::kNone:
      return;
  }
}

}  // namespace

// Note [A non-finite loss stops before the step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A loss that turns NaN or infinite must not reach the weights on any rank
// (detectron2 checks before optimizer.step()), and the check must cost no
// host synchronisation per step. So it is done on the device, as the loss
// scaler does its found-inf check, and the run stops at the next read of the
// logged values:
//   - Only where the run will stop: the Trainer turns it on for its optim
//     wrappers (stop_stepping_after_nonfinite_loss). A program that drives an
//     OptimWrapper itself keeps PyTorch's behaviour, where a GradScaler skips
//     the one step whose gradients overflowed and the next steps go on.
//   - backward() multiplies what it differentiates by 1 while this rank's
//     losses were finite, and by NaN from the first one that was not (it
//     keeps doing so, so the stop is sticky). By 1 changes no bit: the
//     backward pass starts from the same 1.0. By NaN makes every gradient
//     the loss reaches NaN, all of it, and DDP's average carries that to
//     every rank: a peer's bad loss arrives inside the gradients, with no
//     message of its own.
//   - optimizer_step() asks whether this rank's loss was bad or the first
//     element of any gradient is not finite (a gradient a bad rank reached is
//     NaN everywhere, so one element tells), agreed across ranks by the
//     GradientSync where gradients are sharded (FSDP), and skips: by a read
//     of the flag where it is in host memory (the CPU: no device to wait
//     for), on the device for a capturable optimizer on a GPU
//     (DeviceSideStep::step_on_device, the skip GradScaler uses; it keeps a
//     copy of what the step writes, which a capturable step without loss
//     scaling did not pay before). A GradScaler's own check sees the NaN
//     gradients and skips likewise.
//   - The trainer reads nonfinite_loss_iteration() with the logged values
//     (one copy) and every rank stops there, naming the iteration, with the
//     weights of the last good step, in memory and in any checkpoint after.
// Left out: a non-capturable optimizer on a GPU without loss scaling, whose
// skip would need a host read per step; there the stop comes at the read,
// after the step, as before, and the run says so once. Under cuda_graph the
// skip is captured with the step, but the iteration written is the one the
// graph was captured at (a replay writes the captured constant): the stop
// comes at the right read and may name an earlier iteration (issue 62, not
// yet run on a GPU).
torch::Tensor OptimWrapper::guard_nonfinite_loss(const torch::Tensor& loss, const torch::Tensor& to_differentiate,
                                                 int64_t iteration) {
  torch::Tensor finite_or_nan;
  {
    torch::NoGradGuard no_grad;
    const auto as_index = torch::TensorOptions().dtype(torch::kLong).device(loss.device());
    if (!nonfinite_loss_iteration_.defined()) nonfinite_loss_iteration_ = torch::full({1}, -1, as_index);
    const torch::Tensor first_bad = loss.detach().reshape({1}).isfinite().logical_not() & (nonfinite_loss_iteration_ < 0);
    nonfinite_loss_iteration_.copy_(torch::where(first_bad, torch::full({1}, iteration, as_index), nonfinite_loss_iteration_));
    const auto like = to_differentiate.options();
    finite_or_nan = torch::where(nonfinite_loss_iteration_ < 0, torch::ones({1}, like),
                                 torch::full({1}, std::numeric_limits<double>::quiet_NaN(), like))
                        .reshape(to_differentiate.sizes());
  }
  return to_differentiate * finite_or_nan;
}

torch::Tensor OptimWrapper::nonfinite_loss_found() {
  torch::NoGradGuard no_grad;
  torch::Tensor found = (nonfinite_loss_iteration_ >= 0).to(torch::kFloat);
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters()) {
    if (!p.grad().defined()) continue;
    const torch::Tensor grad = p.grad().is_sparse() ? p.grad().coalesce().values() : p.grad();
    if (grad.numel() > 0) grads.push_back(grad.reshape(-1).narrow(0, 0, 1));
  }
  for (const auto& part : detail::by_device_and_dtype(grads)) {
    const torch::Tensor firsts = torch::cat(detail::pick(grads, part));
    const torch::Tensor bad = firsts.isfinite().all().logical_not().reshape({1}).to(torch::kFloat);
    found = torch::maximum(found, bad.to(found.device()));
  }
  return gradient_sync_ ? gradient_sync_->any_rank_true(found) : found;
}

bool OptimWrapper::optimizer_step() {
  if (!nonfinite_loss_iteration_.defined()) {  // no backward() ran, or this wrapper does not stop
    optimizer_->step();
    return true;
  }
  const torch::Tensor found = nonfinite_loss_found();
  if (found.device().is_cpu()) {  // host memory: reading it waits for no device
    if (found.item<float>() != 0.0f) return false;
    optimizer_->step();
    return true;
  }
  if (DeviceSideStep* device = device_side_step(*optimizer_); device != nullptr && device->capturable()) {
    device->stage_host_values();
    device->step_on_device(found);
    return true;
  }
  if (!warned_check_after_step_) {
    warned_check_after_step_ = true;
    logger().warn("a loss that is not finite stops this run after its optimizer step, not before: the "
                  "optimizer is not capturable and there is no loss scaling, so skipping on the GPU would "
                  "cost a host synchronisation per step (capturable: true skips there too)");
  }
  optimizer_->step();
  return true;
}

void OptimWrapper::step() {
  unscale_gradients();
  clip_gradients(parameters(), options_.clip_grad(), gradient_sync_.get(), last_metrics_);
  optimizer_step();
  if (gradient_sync_) gradient_sync_->after_step();
}

void OptimWrapper::zero_grad() {
  // As torch.optim.Optimizer.zero_grad(set_to_none=True), PyTorch 2's
  // default, also for DDP's bucket views: the next backward's gradients are
  // copied into the buckets (divided by the world size on the way, one pass)
  // instead of being added to zeroed ones and then divided (Note [Dividing by the world size],
  // Note [Gradients as bucket views]).
  for (auto& p : parameters()) p.mutable_grad().reset();
}

std::map<std::string, double> OptimWrapper::learning_rates() const {
  return {{"", get_group_option(optimizer_->param_groups().at(main_param_group(*optimizer_)), "lr")}};
}


State OptimWrapper::state() const {
  State state;
  state.put("optimizer", save_optimizer_state(*optimizer_));
  if (gradient_sync_) {
    State sync = gradient_sync_->state();
    if (!sync.empty()) state.put("gradient_sync", std::move(sync));
  }
  return state;
}

void OptimWrapper::load_state(const State& state) {
  LOCKSTEP_CHECK(state.contains("optimizer"), "the checkpoint holds no optimizer state");
  load_optimizer_state(*optimizer_, state.get("optimizer"));
  ++state_generation_;
  // Absent from checkpoints written without a parallel wrapper (or before it existed): the sync starts afresh.
  if (gradient_sync_ && state.contains("gradient_sync")) gradient_sync_->load_state(state.get("gradient_sync"));
}

// ---- OptimWrapperDict ------------------------------------------------------

void OptimWrapperDict::add(const std::string& name, std::shared_ptr<OptimWrapper> wrapper) {
  LOCKSTEP_CHECK(!name.empty(), "an OptimWrapperDict entry needs a name");
  LOCKSTEP_CHECK(wrappers_.count(name) == 0, "OptimWrapperDict already holds '", name, "'");
  wrappers_.emplace(name, std::move(wrapper));
}

OptimWrapper& OptimWrapperDict::operator[](const std::string& name) const {
  auto found = wrappers_.find(name);
  LOCKSTEP_CHECK(found != wrappers_.end(), "no optim wrapper named '", name, "'; the dict holds: ",
                 known_names(wrappers_));
  return *found->second;
}

std::vector<std::string> OptimWrapperDict::names() const {
  std::vector<std::string> result;
  for (const auto& entry : wrappers_) result.push_back(entry.first);
  return result;
}


void OptimWrapperDict::zero_grad() {
  for (auto& entry : wrappers_) entry.second->zero_grad();
}

void OptimWrapperDict::initialize_count_status(int64_t start_iter, int64_t max_iters) {
  for (auto& entry : wrappers_) entry.second->initialize_count_status(start_iter, max_iters);
}

std::map<std::string, double> OptimWrapperDict::learning_rates() const {
  std::map<std::string, double> result;
  for (const auto& entry : wrappers_) result[entry.first] = entry.second->learning_rates().at("");
  return result;
}

LogVars OptimWrapperBase::last_update_metrics() const { return scalars_to_host(last_update_metric_tensors()); }

std::map<std::string, torch::Tensor> OptimWrapperDict::last_update_metric_tensors() const {
  std::map<std::string, torch::Tensor> result;
  for (const auto& entry : wrappers_) {
    for (const auto& metric : entry.second->last_update_metric_tensors()) {
      result[entry.first + "/" + metric.first] = metric.second;
    }
  }
  return result;
}

void OptimWrapperDict::open_step(const StepContext* context) {
  for (auto& entry : wrappers_) open_steps_.push_back(entry.second->begin_step(*context));
}

void OptimWrapperDict::close_step() { open_steps_.clear(); }

void OptimWrapperDict::abandon_step(const std::exception_ptr& error) {
  // DDP's step_failed throws the error every rank agreed on: a wrapper after
  // the first that throws must still be told, or its reducer stays mid-pass
  // and the next step of its network fails (a GAN's second network).
  std::exception_ptr first;
  for (auto& entry : wrappers_) {
    try {
      entry.second->abandon_step(error);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}


State OptimWrapperDict::state() const {
  State state;
  for (const auto& entry : wrappers_) state.put(entry.first, entry.second->state());
  return state;
}

void OptimWrapperDict::load_state(const State& state) {
  for (auto& entry : wrappers_) {
    LOCKSTEP_CHECK(state.contains(entry.first), "the checkpoint holds no optimizer state for '", entry.first, "'");
    entry.second->load_state(state.get(entry.first));
  }
}

std::vector<std::pair<std::string, OptimWrapper*>> OptimWrapperDict::wrappers() {
  std::vector<std::pair<std::string, OptimWrapper*>> result;
  for (auto& entry : wrappers_) result.emplace_back(entry.first, entry.second.get());
  return result;
}

}  // namespace lockstep
