#include "lockstep/optim/device_side_step.h"

#include <utility>

#include "lockstep/compat/cuda_graph.h"
#include "lockstep/compat/internal/optim.h"
#include "lockstep/core/error.h"

namespace lockstep {

// Note [What a captured optimizer step reads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CUDA graph replays the kernels it recorded with the arguments they were
// recorded with. Every host number a plain step passes to a kernel is
// therefore frozen at capture: Adam's bias corrections (from the host step
// count), every optimizer's learning rate (which a scheduler changes each
// iteration), and the scaler's decision to skip (a host read of found-inf,
// which a capture forbids outright). So each lives in a device tensor
// instead, and the kernels read the tensor: the step count is incremented on
// the device, the learning rate is written into its tensor before each
// replay (a fill, outside the graph, no synchronisation), and a skipped step
// is a torch::where that puts back copies taken before it.
//
// The arithmetic is PyTorch's capturable single-tensor path (the bias
// corrections in float32 from a float32 count), so it differs from the plain
// step in the last bits; what is bitwise is a captured run against the eager
// run of the same capturable optimizer, which issues the same kernels. The
// learning rate has two tensors: float64, so that what Python computes from
// its float in double (AdamW's 1 - lr * weight_decay) is computed in double
// here too; and float32, for where Python multiplies a 0-dim float32 tensor
// by its float (the step size: lr / bias_correction1), which a float64 0-dim
// tensor would promote to float64. So the operations are those of Python's
// capturable path with a float lr, value for value and dtype for dtype.
// Nothing here depends on a GPU: on the CPU the same code runs eagerly, which
// is how its tests run everywhere.

DeviceSideStep* device_side_step(torch::optim::Optimizer& optimizer) {
  return dynamic_cast<DeviceSideStep*>(&optimizer);
}

const DeviceSideStep* device_side_step(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const DeviceSideStep*>(&optimizer);
}

namespace detail {

void DeviceValues::stage(const torch::optim::Optimizer& optimizer) {
  // Inside a capture a fill would be recorded with today's value and replayed
  // with it forever; the graph's owner stages before each replay instead.
  if (compat::current_stream_capturing()) {
    LOCKSTEP_CHECK(lrs_.size() == optimizer.param_groups().size(),
                   "a capturable optimizer step was captured before its learning rates were staged "
                   "(stage_host_values() outside the capture)");
    return;
  }
  const auto& groups = optimizer.param_groups();
  if (lrs_.size() != groups.size()) {
    lrs_.resize(groups.size());
    lrs_float_.resize(groups.size());
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& group = groups[i];
    LOCKSTEP_CHECK(!group.params().empty(), "param group ", i, " has no parameters");
    const torch::Device device = group.params().front().device();
    if (!lrs_[i].defined() || lrs_[i].device() != device) {
      lrs_[i] = torch::empty({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
      lrs_float_[i] = torch::empty({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    }
    lrs_[i].fill_(group.options().get_lr());
    lrs_float_[i].fill_(group.options().get_lr());  // rounded once to float32, as a Python float meets a float32 tensor
  }
}

const torch::Tensor& DeviceValues::lr(size_t index) const {
  LOCKSTEP_CHECK(index < lrs_.size() && lrs_[index].defined(),
                 "a device-side optimizer step ran before stage_host_values() wrote its learning rates");
  return lrs_[index];
}

const torch::Tensor& DeviceValues::lr_float(size_t index) const {
  lr(index);  // the same check
  return lrs_float_[index];
}

torch::Tensor& DeviceValues::step(const torch::Tensor& param, int64_t host_count, const torch::Tensor& owner) {
  const void* key = param.unsafeGetTensorImpl();
  const void* state = owner.unsafeGetTensorImpl();
  for (auto& entry : steps_) {
    if (entry.first != key) continue;
    if (entry.second.owner != state) {  // the host state was replaced: its count is the one to go on from
      check_not_capturing("a step count");
      entry.second.value.fill_(static_cast<double>(host_count));
      entry.second.owner = state;
    }
    return entry.second.value;
  }
  check_not_capturing("a step count");
  StepCount fresh;
  fresh.value = torch::full({}, static_cast<double>(host_count), param.options().dtype(torch::kFloat));
  fresh.owner = state;
  steps_.emplace_back(key, std::move(fresh));
  return steps_.back().second.value;
}

void check_single_tensor_for_capture(const std::optional<bool>& foreach) {
  LOCKSTEP_CHECK(!foreach.value_or(false),
                 "the device-side (capturable) step takes one tensor at a time: foreach: true cannot be captured "
                 "(leave foreach unset, or set it false)");
}

bool steps_foreach(const std::optional<bool>& chosen, const std::vector<torch::Tensor>& params) {
  return chosen.has_value() ? *chosen : compat::optimizer_foreach_by_default(params);
}

void check_not_capturing(const char* what) {
  LOCKSTEP_CHECK(!compat::current_stream_capturing(), "cuda_graph: ", what,
                 " would be made inside the captured step, and every replay would make it again (reset it): a "
                 "parameter got its first gradient only at the capture, or the optimizer state was loaded since "
                 "the warm-up; give cuda_graph more warmup_iters, so that every parameter steps eagerly first");
}

void step_unless_found_inf(const std::vector<torch::Tensor>& guarded, const torch::Tensor& found_inf,
                           const std::function<void()>& step) {
  if (!found_inf.defined()) {
    step();
    return;
  }
  LOCKSTEP_CHECK(found_inf.numel() == 1, "found_inf must hold one element, got ", found_inf.numel());
  std::vector<torch::Tensor> before;
  before.reserve(guarded.size());
  for (const auto& tensor : guarded) before.push_back(tensor.clone());
  step();
  const torch::Tensor skip = found_inf.reshape({}) != 0;
  for (size_t i = 0; i < guarded.size(); ++i) {
    torch::Tensor target = guarded[i];
    target.copy_(torch::where(skip, before[i], target));
  }
}

}  // namespace detail
}  // namespace lockstep
