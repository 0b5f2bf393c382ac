// LogValuesOnDevice: the values a training step logs, kept on the device
// until someone reads them, instead of read to the host one by one inside
// the step (Note [Logged values read after the step]).
//
// While a LogValuesOnDevice lives on a thread, Model's default train_step
// puts each logged loss there as a tensor rather than calling .item(); the
// trainer opens one around each step and reads the values only on the
// iterations whose metrics it records, all at once:
//
//   lockstep::LogValuesOnDevice deferred;
//   lockstep::LogVars log_vars = model->run_train_step(batch, optim_wrapper, step);
//   if (records_metrics) deferred.read_into(log_vars);   // one copy to the host
//
// A train_step a model overrides is unaffected: what it returns as numbers,
// it read itself.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/types.h>

#include "lockstep/core/step_metrics.h"

namespace lockstep {


class LogValuesOnDevice {
 public:
  LogValuesOnDevice();
  ~LogValuesOnDevice();
  C10_DISABLE_COPY_AND_ASSIGN(LogValuesOnDevice);

  // The innermost one alive on this thread, or null.
  static LogValuesOnDevice* current();

  // Keeps `value` (one element, any real dtype) under `name`, detached, on
  // its device; a second put of a name replaces the first.
  void put(const std::string& name, const torch::Tensor& value);
  bool empty() const { return names_.empty(); }
  // The values kept, by name: tensors whose storage is where the step left
  // them (a captured step's outputs, which each replay overwrites).
  std::map<std::string, torch::Tensor> tensors() const;
  // Reads every value with one copy to the host and adds them to `log_vars`
  // (a value of the same name there is replaced). Nothing kept: no copy.
  void read_into(LogVars& log_vars) const;

 private:
  std::vector<std::string> names_;
  std::vector<torch::Tensor> values_;
  LogValuesOnDevice* outer_;
};

// Reads `values` (one-element tensors) with one copy to the host into
// `log_vars`, replacing values of the same names.
void read_logged_values(const std::map<std::string, torch::Tensor>& values, LogVars& log_vars);

}  // namespace lockstep
