#include "lockstep/optim/param_scheduler.h"

#include "lockstep/optim/param_groups.h"

namespace lockstep {

std::vector<double> InitialValues::get_or_record(const std::string& option,
                                                 const std::vector<double>& current) {
  auto found = values_.find(option);
  if (found == values_.end() || found->second.size() != current.size()) {
    // A different group count means a different optimizer: start afresh.
    found = values_.insert_or_assign(option, current).first;
  }
  return found->second;
}

void InitialValues::set(const std::string& option, std::vector<double> values) {
  values_[option] = std::move(values);
}

ParamScheduler::ParamScheduler(torch::optim::Optimizer& optimizer, std::unique_ptr<ScheduleRule> rule,
                               const ScheduleSpan& span, const SchedulerContext& context)
    : optimizer_(optimizer), rule_(std::move(rule)), span_(span) {
  LOCKSTEP_CHECK(rule_ != nullptr, "ParamScheduler needs a rule");
  check_option(span_.begin() >= 0, "begin", "begin must be non-negative, got ", span_.begin());
  check_option(span_.end() > span_.begin(), "end", "end (", span_.end(),
               ") must be larger than begin (", span_.begin(), ")");
  check_option(has_group_option(optimizer_, span_.param()), "param", optimizer_type_name(optimizer_),
               " has no option '", span_.param(), "' to schedule");
  LOCKSTEP_CHECK(context.initial_values != nullptr, "SchedulerContext::initial_values is null");
  start_values_ = get_group_options(optimizer_, span_.param());
  std::vector<double> initial =
      context.initial_values->get_or_record(span_.param(), get_group_options(optimizer_, span_.param()));
  rule_->prepare(span_, initial);
  context.initial_values->set(span_.param(), initial);
  base_values_ = std::move(initial);
  step();
}

void ParamScheduler::step() {
  const size_t groups = optimizer_.param_groups().size();
  LOCKSTEP_CHECK(groups == base_values_.size(), name(), ": the optimizer had ", base_values_.size(),
                 " param group(s) when the scheduler was built and has ", groups, " now");
  ++global_step_;
  if (span_.begin() <= global_step_ && global_step_ < span_.end()) {
    ++last_step_;
    // All groups are computed before any is written, as mmengine does.
    std::vector<double> next(groups);
    for (size_t g = 0; g < groups; ++g) {
      next[g] = rule_->value(last_step_, g, get_group_option(optimizer_, g, span_.param()),
                             base_values_[g]);
    }
    for (size_t g = 0; g < groups; ++g) set_group_option(optimizer_, g, span_.param(), next[g]);
  }
  last_values_ = get_group_options(optimizer_, span_.param());
}

void ParamScheduler::rewind() {
  const size_t groups = optimizer_.param_groups().size();
  LOCKSTEP_CHECK(groups == start_values_.size(), name(), ": the optimizer had ", start_values_.size(),
                 " param group(s) when the scheduler was built and has ", groups, " now");
  for (size_t g = 0; g < groups; ++g) set_group_option(optimizer_, g, span_.param(), start_values_[g]);
  last_step_ = -1;
  global_step_ = -1;
}

void replay_schedulers(const std::vector<std::shared_ptr<ParamScheduler>>& schedulers, int64_t steps) {
  for (const auto& scheduler : schedulers) {
    LOCKSTEP_CHECK(scheduler->replayable(), scheduler->name(), " follows a metric, not the iterations, so it cannot "
                   "be replayed to iteration ", steps, "; resume at the world size the checkpoint was written by");
  }
  // The first scheduler's start values are the optimizer's own: restore them last.
  for (auto it = schedulers.rbegin(); it != schedulers.rend(); ++it) (*it)->rewind();
  for (const auto& scheduler : schedulers) scheduler->step();
  for (int64_t i = 0; i < steps; ++i) {
    for (const auto& scheduler : schedulers) scheduler->step();
  }
}

void ParamScheduler::record_last_values() { last_values_ = get_group_options(optimizer_, span_.param()); }

std::string ParamScheduler::name() const {
  if (span_.param() == "lr") return rule_->name() + "LR";
  if (span_.param() == "momentum") return rule_->name() + "Momentum";
  return rule_->name() + "(" + span_.param() + ")";
}

namespace {

// What must agree between a saved state and the scheduler loading it.
nlohmann::json schedule_of(const std::string& name, const ScheduleSpan& span,
                           const nlohmann::json& options) {
  return {{"type", name}, {"begin", span.begin()}, {"end", span.end()}, {"options", options}};
}

}  // namespace

State ParamScheduler::state() const {
  State state;
  state.values["schedule"] = schedule_of(name(), span_, rule_->options());
  state.values["last_step"] = last_step_;
  state.values["global_step"] = global_step_;
  state.values["base_values"] = base_values_;
  state.values["last_values"] = last_values_;
  return state;
}

void ParamScheduler::load_state(const State& state) {
  const nlohmann::json& values = state.values;
  const char* what = "scheduler state";
  LOCKSTEP_CHECK(values.is_object() && values.contains("schedule") && values.contains("last_step") &&
                     values.contains("global_step") && values.contains("base_values") &&
                     values.contains("last_values"),
                 name(), ": the ", what, " lacks schedule, last_step, global_step, base_values or last_values");
  const nlohmann::json expected = schedule_of(name(), span_, rule_->options());
  LOCKSTEP_CHECK(values.at("schedule") == expected, name(), ": the checkpoint's schedule ",
                 values.at("schedule").dump(), " differs from the configured one ", expected.dump(),
                 "; resume with the configuration the checkpoint was trained with");
  try {
    auto base_values = values.at("base_values").get<std::vector<double>>();
    auto last_values = values.at("last_values").get<std::vector<double>>();
    LOCKSTEP_CHECK(base_values.size() == base_values_.size(), name(), ": the ", what, " has ",
                   base_values.size(), " param group(s) but the optimizer has ", base_values_.size());
    LOCKSTEP_CHECK(last_values.size() == base_values_.size(), name(), ": the ", what, " has ",
                   last_values.size(), " last values for ", base_values_.size(), " param group(s)");
    const int64_t last_step = values.at("last_step").get<int64_t>();
    const int64_t global_step = values.at("global_step").get<int64_t>();
    base_values_ = std::move(base_values);
    last_values_ = std::move(last_values);
    last_step_ = last_step;
    global_step_ = global_step;
  } catch (const nlohmann::json::exception& error) {
    LOCKSTEP_FAIL(name(), ": malformed ", what, ": ", error.what());
  }
}

}  // namespace lockstep
