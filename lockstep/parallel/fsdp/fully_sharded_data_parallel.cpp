// FullyShardedDataParallel: the front over its three parts (the header says
// which does what); what is left here is FSDP's own small API.
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"

#include <algorithm>
#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/fsdp/internal/memory_meter.h"
#include "lockstep/parallel/fsdp/internal/resharding.h"
#include "lockstep/parallel/fsdp/internal/sharded_model.h"
#include "lockstep/parallel/fsdp/internal/state_dict_codec.h"
#include "lockstep/parallel/fsdp/internal/step_runtime.h"
#include "lockstep/parallel/fsdp/internal/unit_builder.h"

namespace lockstep {

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group, FSDPOptions options)
    : model_(std::make_unique<fsdp::ShardedModel>()) {
  LOCKSTEP_CHECK(module != nullptr, "FullyShardedDataParallel needs a module");
  if (!group) group = world();
  LOCKSTEP_CHECK(group != nullptr, "FullyShardedDataParallel needs an initialised process group "
                 "(call lockstep::init_from_env() or init_process_group() first)");
  model_->module = std::move(module);
  if (options.per_parameter_sharding()) {
    // FSDP2 steps each parameter's rows, over the whole group.
    LOCKSTEP_CHECK(options.sharding_strategy() != ShardingStrategy::kNoShard,
                   "FullyShard (per-parameter sharding) shards: FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD, not NO_SHARD");
    options.use_orig_params(true);
  }
  model_->options = std::move(options);
  const std::string name = group->name() + "." + next_group_name("fsdp");
  fsdp::UnitBuilder::make_groups(*model_, group, name);
  // The step check's exchange is in flight between the units' collectives,
  // so it is a side channel (Note [One mesh per process], Note [FSDP's step check]).
  const auto& own = model_->group;
  step_check_ = std::make_unique<fsdp::StepCheck>(own->size() > 1 ? own->side_channel(name + ".check") : nullptr);
  meter_ = std::make_unique<fsdp::MemoryMeter>(*model_);
  runtime_ = std::make_unique<fsdp::StepRuntime>(*model_, *step_check_, *meter_);
  fsdp::StepRuntime* runtime = runtime_.get();
  builder_ = std::make_unique<fsdp::UnitBuilder>(
      *model_, step_check_.get(), [runtime](int unit, size_t slot) { runtime->on_grad_ready(unit, slot); });
  builder_->build();
  runtime_->units_built();
  codec_ = std::make_unique<fsdp::StateDictCodec>(*model_);
  reset_peak_stats();
  if (own->rank() == 0) {
    int64_t largest = 0;
    int companions = 0;
    for (const auto& unit : model_->units) {
      largest = std::max(largest, unit->layout().numel);
      companions += model_->is_companion(unit->index()) ? 1 : 0;
    }
    const auto& policy = model_->options.auto_wrap_policy();
    logger().info(
        "FSDP {}{}: {} unit(s) over {} rank(s) (shard group of {}), largest {} parameters, policy {}{}{}",
        to_string(model_->options.sharding_strategy()),
        model_->options.per_parameter_sharding() ? " (FullyShard, per-parameter)" : "",
        model_->units.size() - static_cast<size_t>(companions), own->size(),
        model_->shard_group ? model_->shard_group->size() : 1, largest, policy ? policy->describe() : "none",
        companions > 0 ? str_cat("; ", companions, " hold frozen parameters of another dtype beside their unit's") : "",
        model_->prebuilt_units > 0 ? str_cat("; ", model_->prebuilt_units, " sharded while the model was built") : "");
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;

fsdp::ShardPlan FullyShardedDataParallel::shard_plan(const FSDPOptions& options, std::shared_ptr<ProcessGroup> group,
                                                     torch::Device compute_device) {
  return fsdp::UnitBuilder::shard_plan(options, std::move(group), compute_device);
}

// --- GradientSync ----------------------------------------------------------

void FullyShardedDataParallel::begin_forward(bool sync) { runtime_->begin_forward(sync); }

void FullyShardedDataParallel::begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration) {
  runtime_->begin_backward(loss, sync, iteration);
}

void FullyShardedDataParallel::end_backward(bool /*sync*/) { runtime_->end_backward(); }

void FullyShardedDataParallel::after_step() { runtime_->after_step(); }

void FullyShardedDataParallel::step_failed(const std::exception_ptr& error, bool reduced, bool /*sync*/,
                                           int64_t iteration) {
  runtime_->step_failed(error, reduced, iteration);
}

torch::Tensor FullyShardedDataParallel::reduce_grad_norm(const torch::Tensor& local, double norm_type) {
  if (!model_->shard_group || model_->shard_group->size() == 1) return local;
  // Gradients are identical across replicas (HYBRID_SHARD), so the shard group holds each element once.
  torch::NoGradGuard no_grad;
  if (std::isinf(norm_type)) {
    torch::Tensor value = local.detach().to(torch::kFloat).reshape({1}).clone();
    model_->shard_group->all_reduce(value, ReduceOp::kMax);
    return value.reshape({});
  }
  torch::Tensor value = local.detach().to(torch::kFloat).pow(norm_type).reshape({1});
  model_->shard_group->all_reduce(value, ReduceOp::kSum);
  return value.pow(1.0 / norm_type).reshape({});
}

torch::Tensor FullyShardedDataParallel::any_rank_true(const torch::Tensor& local) {
  if (model_->group->size() == 1) return local;
  torch::Tensor value = local.clone();
  model_->group->all_reduce(value, ReduceOp::kMax);
  return value;
}

// --- parameters --------------------------------------------------------------

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::named_shard_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& unit : model_->units) {
    named.emplace_back(unit->path().empty() ? "flat_param" : unit->path() + ".flat_param", unit->shard());
  }
  return named;
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::named_orig_parameters() const {
  LOCKSTEP_CHECK(model_->options.use_orig_params(),
                 "FSDP: named_orig_parameters() needs FSDPOptions().use_orig_params(true) "
                 "(model_wrapper.use_orig_params: true)");
  std::vector<std::pair<int64_t, std::pair<std::string, torch::Tensor>>> by_model_index;
  for (const auto& unit : model_->units) {
    for (size_t s = 0; s < unit->slots().size(); ++s) {
      const auto& slot = unit->slots()[s];
      if (!slot.trainable) continue;  // frozen: no optimizer steps it
      by_model_index.push_back({slot.model_index, {slot.name, unit->gradients().orig_params()[s]}});
    }
  }
  std::sort(by_model_index.begin(), by_model_index.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& entry : by_model_index) named.push_back(std::move(entry.second));
  return named;
}

std::vector<torch::Tensor> FullyShardedDataParallel::shard_parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& unit : model_->units) params.push_back(unit->shard());
  return params;
}

void FullyShardedDataParallel::shards_changed() { runtime_->shards_changed(); }

void FullyShardedDataParallel::track_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer) {
  meter_->track_optimizer(std::move(optimizer));
}

// --- state dicts -------------------------------------------------------------

std::map<std::string, torch::Tensor> FullyShardedDataParallel::full_state_dict(bool rank0_only) {
  return codec_->full_state_dict(rank0_only);
}

LoadReport FullyShardedDataParallel::load_full_state_dict(const std::map<std::string, torch::Tensor>& weights,
                                                          bool strict, const std::string& source) {
  return codec_->load_full_state_dict(weights, strict, source);
}

State FullyShardedDataParallel::sharded_state_dict() const { return codec_->sharded_state_dict(); }

void FullyShardedDataParallel::load_sharded_state_dict(const State& state, const std::string& source) {
  codec_->load_sharded_state_dict(state, source);
}

nlohmann::json FullyShardedDataParallel::layout() const { return codec_->layout(); }

State FullyShardedDataParallel::resharded_state_dict(const nlohmann::json& saved_layout,
                                                     const std::vector<StateReader>& saved) const {
  return fsdp::Resharding(*model_, *codec_).state_dict(saved_layout, saved);
}

State FullyShardedDataParallel::resharded_optimizer_state(const torch::optim::Optimizer& optimizer,
                                                          const nlohmann::json& saved_layout,
                                                          const std::vector<StateReader>& saved) const {
  return fsdp::Resharding(*model_, *codec_).optimizer_state(optimizer, saved_layout, saved);
}

State FullyShardedDataParallel::full_optimizer_state(const torch::optim::Optimizer& optimizer, const State& local,
                                                     bool rank0_only) {
  return codec_->full_optimizer_state(optimizer, local, rank0_only);
}

State FullyShardedDataParallel::shard_optimizer_state(const torch::optim::Optimizer& optimizer,
                                                      const State& full) const {
  return codec_->shard_optimizer_state(optimizer, full);
}

// --- local parts -----------------------------------------------------------------

std::vector<FullyShardedDataParallel::LocalPart> FullyShardedDataParallel::local_parts() const {
  const bool first_replica = model_->replicate_group == nullptr || model_->replicate_group->rank() == 0;
  std::vector<LocalPart> parts;
  for (const auto& unit : model_->units) {
    for (size_t s = 0; s < unit->slots().size(); ++s) {
      const fsdp::FlatSlot& slot = unit->slots()[s];
      const fsdp::ShardOverlap mine = unit->layout().part(slot.offset, slot.numel);
      LocalPart part;
      part.name = slot.name;
      part.aliases = slot.aliases;
      part.shape = slot.shape;
      part.begin = mine.length > 0 ? mine.in_range : 0;
      part.values = unit->shard().detach().narrow(0, mine.length > 0 ? mine.in_shard : 0, mine.length);
      const auto& leaves = unit->gradients().orig_params();
      if (slot.trainable && s < leaves.size()) part.leaf = leaves[s];
      part.first_replica = first_replica;
      parts.push_back(std::move(part));
    }
  }
  return parts;
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::whole_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> whole = model_->frozen;
  whole.insert(whole.end(), model_->buffers.begin(), model_->buffers.end());
  return whole;
}

// --- introspection -------------------------------------------------------------

const std::vector<std::unique_ptr<fsdp::FlatParamUnit>>& FullyShardedDataParallel::units() const {
  return model_->units;
}

const FSDPOptions& FullyShardedDataParallel::options() const { return model_->options; }

const fsdp::ExecutionOrder& FullyShardedDataParallel::execution_order() const { return runtime_->execution_order(); }

FSDPMemoryStats FullyShardedDataParallel::memory_stats() const { return meter_->stats(); }

void FullyShardedDataParallel::reset_peak_stats() { meter_->reset_peaks(runtime_->gathered_units()); }

// --- summon_full_params ----------------------------------------------------

FullyShardedDataParallel::FullParams::FullParams(FullyShardedDataParallel* fsdp, bool writeback)
    : fsdp_(fsdp), writeback_(writeback) {
  LOCKSTEP_CHECK(!fsdp_->runtime_->in_backward(), "summon_full_params during backward");
  for (auto& unit : fsdp_->model_->units) {
    if (unit->state() == fsdp::FlatParamUnit::State::kGathering) unit->finish_gather();
    flats_.push_back(unit->gather_full_precision());
    unit->point_params_at(flats_.back());
  }
}

FullyShardedDataParallel::FullParams::~FullParams() {
  try {
    for (auto& unit : fsdp_->model_->units) {
      if (writeback_) unit->load_slice(0, flats_[static_cast<size_t>(unit->index())]);
      unit->restore_param_views();
    }
    // Units that stay gathered see the written-back shards (collective; every rank does it).
    if (writeback_) fsdp_->runtime_->refresh_persistent_units();
  } catch (const std::exception& error) {
    logger().error("summon_full_params: {}", error.what());
  }
}

std::unique_ptr<FullyShardedDataParallel::FullParams> FullyShardedDataParallel::summon_full_params(bool writeback) {
  return std::unique_ptr<FullParams>(new FullParams(this, writeback));
}

}  // namespace lockstep
