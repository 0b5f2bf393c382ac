#include "lockstep/engine/cuda_graph_step.h"

#include <sstream>
#include <utility>

#include "lockstep/compat/cuda_graph.h"
#include "lockstep/config/config.h"
#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/spelling.h"
#include "lockstep/model/log_values_on_device.h"
#include "lockstep/optim/device_side_step.h"

namespace lockstep {

// Note [The whole step as one CUDA graph]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A capture records the kernels the host issues, with their arguments, and
// runs none of them; a replay runs them again, reading and writing the same
// addresses. The step is captured through the code that runs it eagerly
// (Model::run_train_step), so a captured step is the eager one, provided
// that nothing in it depends on the host between replays:
//   - the batch: copied before each replay into device tensors made at
//     capture (the preprocessor's move to the device is then a no-op);
//   - the optimizer's host numbers: a device-side step (Note [What a captured
//     optimizer step reads]), its learning rates staged before each replay;
//   - the loss scaler: its skip is decided on the device
//     (GradScaler::step hands found-inf to the optimizer);
//   - the logged values: kept as tensors and read after the replay (Note
//     [Logged values read after the step]);
//   - the optim wrapper's count of micro-steps, which its host code keeps:
//     count_replayed_backward() advances it for each replay;
//   - what differs between kinds of step (an accumulating micro-step or the
//     one that updates, the last window's divisor, a partial batch) selects
//     another graph, captured the first time that kind comes.
// Gradients are set to none after each update, inside the capture as in
// eager, so the captured backward allocates them in the graph's own pool and
// every replay writes them there. The host's .grad must then name, after
// each replay, the tensors that graph's capture left (an accumulating
// micro-step's gradients, which the next micro-step's graph adds to; none
// after an update), else the next step's kind is chosen on stale gradients:
// each graph keeps them and puts them back. The optimizer's states are made
// during the eager warm-up, outside any pool, and keep their addresses; one
// made during a capture would be remade by every replay, so that is an
// error. The options the step's kernels hold as numbers (momentum, betas,
// weight decay) are compared before each replay: only the learning rate is
// read from the device. Metrics (grad_norm, loss_scale) are an updating
// graph's; an accumulating micro-step leaves the last update's. Host work in the
// step runs once, at capture: the after_backward hooks' host effects are not
// replayed (hook.h says so). What cannot be captured at all (a strategy's
// collectives over Gloo, CPU offload, several optimizers) is refused before
// training; what the model does that reads the host fails the capture with
// the operation named (compat::capture_failure_message).
//
// The warm-up uses the same capturable optimizer, so a run with cuda_graph
// is bitwise the eager run whose optimizer sets `capturable: true`: the same
// kernels, in the same order, on the same values.

CudaGraphOptions parse_cuda_graph_options(const Config& section) {
  CudaGraphOptions options;
  if (section.is_null()) return options;
  LOCKSTEP_CHECK(section.is_map(), section.where(), ": cuda_graph is a map: {warmup_iters: 3}");
  options.warmup_iters(section.get<int64_t>("warmup_iters", options.warmup_iters()));
  LOCKSTEP_CHECK(options.warmup_iters() >= 1, section.where("warmup_iters"),
                 ": warmup_iters must be at least 1 (the optimizer's states and the kernels' handles are made by "
                 "eager steps before the capture), got ", options.warmup_iters());
  check_all_used(section, "cuda_graph");
  return options;
}

std::string prepare_optimizer_for_cuda_graph(OptimWrapperBase& optim_wrapper, const std::string& optimizer_type) {
  const auto wrappers = optim_wrapper.wrappers();
  if (optim_wrapper.as_dict() != nullptr || wrappers.size() != 1) {
    return str_cat("the model trains with several optimizers (", known_names(wrappers),
                   ") in a train_step of its own; cuda_graph captures the step of one optimizer");
  }
  DeviceSideStep* device = device_side_step(wrappers.front().second->optimizer());
  if (device == nullptr) {
    return str_cat("the optimizer ", optimizer_type.empty() ? std::string("built in code") : "'" + optimizer_type + "'",
                   " has no device-side step, and a captured step must not read its step count or learning rate "
                   "on the host; cuda_graph captures SGD, Adam and AdamW");
  }
  try {
    device->set_capturable(true);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

struct CudaGraphStep::Captured {
  compat::CudaGraph graph;
  Batch inputs;                                  // on the model's device; each replay's batch is copied in
  std::map<std::string, torch::Tensor> logged;   // the step's logged values, rewritten by each replay
  LogVars returned;                              // what train_step returned at capture (numbers it read itself)
  bool updates = false;                          // the step ends with an optimizer step
  std::map<std::string, torch::Tensor> metrics;  // the optim wrapper's update metrics this graph rewrites
  // Each parameter's gradient as the capture left it (undefined after an
  // update): a replay writes these, and the next step's graph reads them.
  std::vector<torch::Tensor> gradients;
  std::vector<double> baked_options;             // the optimizer's options the kernels hold (all but lr)
  int64_t replays = 0;
};

CudaGraphStep::CudaGraphStep(CudaGraphOptions options) : options_(options) {
  LOCKSTEP_CHECK(options_.warmup_iters() >= 1, "CudaGraphOptions: warmup_iters must be at least 1, got ",
                 options_.warmup_iters());
}

CudaGraphStep::~CudaGraphStep() = default;

std::string CudaGraphStep::step_kind(const Batch& batch, OptimWrapper& optim_wrapper) {
  std::ostringstream kind;
  for (const auto& [name, tensor] : batch) kind << name << ':' << tensor.scalar_type() << tensor.sizes() << ' ';
  // should_sync(): this backward is the last of its window, so the step follows it.
  const AccumulationWindow& window = optim_wrapper.accumulation();
  kind << "| updates " << window.should_sync() << " | divisor " << window.loss_divisor() << " | gradients";
  // Where the gradients are matters, not only whether there are any: a
  // backward into existing gradients adds to those very tensors.
  bool any = false;
  for (const auto& param : optim_wrapper.parameters()) {
    if (!param.grad().defined()) continue;
    kind << ' ' << param.grad().data_ptr();
    any = true;
  }
  if (!any) kind << " none";
  return kind.str();
}

std::vector<const void*> CudaGraphStep::fingerprint(OptimWrapper& optim_wrapper) const {
  std::vector<const void*> pointers;
  for (const auto& param : optim_wrapper.parameters()) pointers.push_back(param.data_ptr());
  return pointers;
}

CudaGraphStep::Outputs CudaGraphStep::run_eagerly(Model& model, OptimWrapperBase& optim_wrapper, const Batch& batch,
                                                  const StepContext& step) {
  Outputs outputs;
  LogValuesOnDevice logged;
  compat::run_on_side_stream([&] { outputs.returned = model.run_train_step(batch, optim_wrapper, step); });
  outputs.logged = logged.tensors();
  return outputs;
}

CudaGraphStep::Captured& CudaGraphStep::capture(Model& model, OptimWrapper& optim_wrapper, const Batch& batch,
                                                const StepContext& step, const std::string& kind) {
  auto captured = std::make_unique<Captured>();
  const torch::Device device = model.device();
  for (const auto& [name, tensor] : batch) {
    torch::Tensor input = torch::empty_like(tensor, tensor.options().device(device));
    input.copy_(tensor);
    captured->inputs.set(name, input);
  }
  DeviceSideStep& device_step = *device_side_step(optim_wrapper.optimizer());
  device_step.stage_host_values();
  captured->baked_options = device_step.baked_options();
  captured->updates = optim_wrapper.accumulation().should_sync();  // this backward closes its window: the step follows
  {
    LogValuesOnDevice logged;
    captured->graph.capture([&] { captured->returned = model.run_train_step(captured->inputs, optim_wrapper, step); });
    captured->logged = logged.tensors();
  }
  captured->metrics = optim_wrapper.last_update_metric_tensors();
  for (const auto& param : optim_wrapper.parameters()) captured->gradients.push_back(param.grad());
  logger().info("cuda_graph: captured the training step ({} graph(s) now) for steps of kind [{}]", graphs_.size() + 1,
                kind);
  return *(graphs_[kind] = std::move(captured));
}

namespace {
bool any_gradient(OptimWrapperBase& optim_wrapper) {
  for (const auto& entry : optim_wrapper.wrappers()) {
    for (const auto& param : entry.second->parameters()) {
      if (param.grad().defined()) return true;
    }
  }
  return false;
}
}  // namespace

CudaGraphStep::Outputs CudaGraphStep::run(Model& model, OptimWrapperBase& optim_wrapper, const Batch& batch,
                                          const StepContext& step) {
  // Captures begin where an accumulation window does (no gradients yet), so
  // that every gradient a graph adds to was made by a graph, in its pool.
  if (eager_steps_ < options_.warmup_iters() || (graphs_.empty() && any_gradient(optim_wrapper))) {
    Outputs outputs = run_eagerly(model, optim_wrapper, batch, step);
    ++eager_steps_;
    return outputs;
  }
  LOCKSTEP_CHECK(optim_wrapper.as_dict() == nullptr && optim_wrapper.wrappers().size() == 1,
                 "cuda_graph captures the step of one optimizer (prepare_optimizer_for_cuda_graph says why not)");
  OptimWrapper& wrapper = *optim_wrapper.wrappers().front().second;
  LOCKSTEP_CHECK(device_side_step(wrapper.optimizer()) != nullptr &&
                     device_side_step(wrapper.optimizer())->capturable(),
                 "cuda_graph: the optimizer's step is not capturable (prepare_optimizer_for_cuda_graph turns it on)");

  // Weights or optimizer state loaded since the capture: the graphs hold the
  // old tensors. Capture again from the next window's start.
  std::vector<const void*> now = fingerprint(wrapper);
  if (!graphs_.empty() && (now != captured_for_ || wrapper.state_generation() != captured_generation_)) {
    // Warm up again: the optimizer state the graphs must find made is new.
    logger().info("cuda_graph: the parameters or the optimizer state were replaced since the capture; "
                  "warming up and capturing the step again");
    graphs_.clear();
    eager_steps_ = 1;
    return run_eagerly(model, optim_wrapper, batch, step);
  }
  captured_for_ = std::move(now);
  captured_generation_ = wrapper.state_generation();

  const std::string kind = step_kind(batch, wrapper);
  auto found = graphs_.find(kind);
  Captured* graph = nullptr;
  if (found == graphs_.end()) {
    // The capture's host code counts this micro-step, as an eager step does.
    graph = &capture(model, wrapper, batch, step, kind);
  } else {
    graph = found->second.get();
    DeviceSideStep& device_step = *device_side_step(wrapper.optimizer());
    LOCKSTEP_CHECK(device_step.baked_options() == graph->baked_options,
                   "cuda_graph: the optimizer's options other than the learning rate (momentum, betas, weight "
                   "decay, ...) changed since the step was captured, and a replay would keep the old values; only "
                   "the learning rate may follow a schedule under cuda_graph (a momentum or weight-decay "
                   "scheduler cannot)");
    for (const auto& [name, tensor] : batch) graph->inputs.at(name).copy_(tensor, /*non_blocking=*/true);
    device_step.stage_host_values();
    auto scope = optim_wrapper.begin_step(step);
    wrapper.count_replayed_backward();
  }
  graph->graph.replay();
  ++graph->replays;
  // What the replay wrote, the host must point at: the gradients the next
  // kind of step adds to (or none after an update), and an update's metrics.
  const std::vector<torch::Tensor> params = wrapper.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor param = params[i];
    param.mutable_grad() = graph->gradients[i];
  }
  if (graph->updates) wrapper.set_last_metric_tensors(graph->metrics);
  return Outputs{graph->returned, graph->logged};
}

}  // namespace lockstep
