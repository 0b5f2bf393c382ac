#include "lockstep/model/log_values_on_device.h"

#include "lockstep/core/error.h"
#include "lockstep/core/scalars_to_host.h"

namespace lockstep {

// Note [Logged values read after the step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// mmengine's parse_losses turns every logged loss into a Python number
// inside the step: one host synchronisation per value per step, each
// stalling the queue of kernels the GPU would otherwise run ahead on. The
// logger reads them only every `interval` iterations (and the metrics are
// gathered every gather_metric_period), so the reads are moved to where the
// values are used: the step keeps them as device tensors, and the trainer
// copies them to the host together, only on the iterations it records. A
// CUDA graph needs the same thing for a harder reason: a read inside a
// capture is an error, and the captured step's logged values are tensors
// the capture made, which each replay rewrites and the trainer reads after it.

namespace {
thread_local LogValuesOnDevice* t_current = nullptr;
}  // namespace

LogValuesOnDevice::LogValuesOnDevice() : outer_(t_current) { t_current = this; }

LogValuesOnDevice::~LogValuesOnDevice() { t_current = outer_; }

LogValuesOnDevice* LogValuesOnDevice::current() { return t_current; }

void LogValuesOnDevice::put(const std::string& name, const torch::Tensor& value) {
  LOCKSTEP_CHECK(value.defined() && value.numel() == 1, "logged value '", name, "' must hold one element, got ",
                 value.defined() ? value.numel() : 0);
  // A view, no kernel: the conversion to a host double waits for the read.
  torch::Tensor kept = value.detach().reshape({});
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) {
      values_[i] = kept;
      return;
    }
  }
  names_.push_back(name);
  values_.push_back(kept);
}

std::map<std::string, torch::Tensor> LogValuesOnDevice::tensors() const {
  std::map<std::string, torch::Tensor> result;
  for (size_t i = 0; i < names_.size(); ++i) result[names_[i]] = values_[i];
  return result;
}

void LogValuesOnDevice::read_into(LogVars& log_vars) const { read_logged_values(tensors(), log_vars); }

void read_logged_values(const std::map<std::string, torch::Tensor>& values, LogVars& log_vars) {
  for (const auto& [name, value] : scalars_to_host(values)) log_vars[name] = value;
}

}  // namespace lockstep
