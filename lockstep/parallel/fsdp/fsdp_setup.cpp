// FullyShardedDataParallel: construction (groups, units, interception) and
// teardown. The per-iteration runtime is in fully_sharded_data_parallel.cpp.
#include <atomic>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <torch/nn/modules/container/sequential.h>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/shape_text.h"
#include "lockstep/dist/comm.h"
#include "lockstep/dist/init.h"
#include "lockstep/dist/hierarchy.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"

namespace lockstep {
namespace {

std::string display(const std::string& path) { return path.empty() ? "(root)" : "'" + path + "'"; }

bool path_contains(const std::string& unit_path, const std::string& name) {
  return unit_path.empty() || name.rfind(unit_path + ".", 0) == 0;
}

// What FSDP puts into a torch::nn::Sequential in place of a unit: the unit's
// forward inside its scope.
class UnitEntryImpl : public torch::nn::Module {
 public:
  UnitEntryImpl(torch::nn::AnyModule inner, const torch::nn::Module* unit, std::string path,
                c10::optional<torch::Dtype> input_dtype)
      : torch::nn::Module("lockstep::FSDPUnitEntry"),
        inner_(std::move(inner)),
        unit_(unit),
        path_(std::move(path)),
        input_dtype_(input_dtype) {}

  torch::Tensor forward(torch::Tensor input) {
    auto scope = fsdp::unit_scope(*unit_);
    if (input_dtype_ && input.is_floating_point()) input = input.to(*input_dtype_);
    torch::Tensor output;
    try {
      output = inner_.forward(std::move(input));
    } catch (const Error&) {
      throw;
    } catch (...) {
      rethrow_with_context("FSDP unit '" + path_ +
                           "' (a Sequential entry; FSDP intercepts Tensor -> Tensor entries only, a unit with "
                           "another signature must open lockstep::fsdp::unit_scope in its own forward)");
    }
    return scope.output(output);
  }

 private:
  torch::nn::AnyModule inner_;
  const torch::nn::Module* unit_;
  std::string path_;
  c10::optional<torch::Dtype> input_dtype_;  // cast_forward_inputs
};

}  // namespace

int FullyShardedDataParallel::hybrid_shard_group_size(const FSDPOptions& options, const ProcessGroup& group) {
  int size = options.hybrid_shard_size();
  if (size == 0) {
    auto node = local_group();
    size = node->size();
    const int first = node->global_ranks().front();
    bool consecutive = group.size() == get_world_size();
    for (int i = 0; i < node->size(); ++i) consecutive = consecutive && node->global_ranks()[i] == first + i;
    LOCKSTEP_CHECK(consecutive && first % size == 0, "HYBRID_SHARD: the ranks of this node (",
                   str_cat(node->global_ranks().size()), " of them, starting at ", first,
                   ") are not one block of consecutive ranks of the world; set hybrid_shard_size");
  }
  LOCKSTEP_CHECK(size >= 1 && group.size() % size == 0, "HYBRID_SHARD: hybrid_shard_size ", size,
                 " does not divide the world size ", group.size());
  return size;
}

fsdp::ShardPlan FullyShardedDataParallel::shard_plan(const FSDPOptions& options, std::shared_ptr<ProcessGroup> group,
                                                     torch::Device compute_device) {
  if (!group) group = world();
  LOCKSTEP_CHECK(group != nullptr, "FSDP shard_plan needs an initialised process group");
  fsdp::ShardPlan plan;
  switch (options.sharding_strategy()) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
      plan.shard_rank = group->rank();
      plan.shard_world = group->size();
      break;
    case ShardingStrategy::kNoShard:
      break;
    case ShardingStrategy::kHybridShard:
      plan.shard_world = hybrid_shard_group_size(options, *group);
      plan.shard_rank = group->rank() % plan.shard_world;
      break;
  }
  plan.compute_device = compute_device;
  plan.shard_device = options.offload_params() ? torch::Device(torch::kCPU) : compute_device;
  if (options.sync_module_states() && group->size() > 1) plan.sync_group = std::move(group);
  return plan;
}

// Modules sharded while the model was built are units whatever the wrap
// policy says; units are listed in module order.
void FullyShardedDataParallel::add_prebuilt_units(std::vector<std::string>& unit_paths) const {
  const std::set<std::string> chosen(unit_paths.begin(), unit_paths.end());
  std::vector<std::string> prebuilt;
  unit_paths.clear();
  for (const auto& item : module_->named_modules("", /*include_self=*/false)) {
    const bool cut = fsdp::has_prebuilt_shard(item.value().get());
    if (cut) prebuilt.push_back(item.key());
    if (cut || chosen.count(item.key()) > 0) unit_paths.push_back(item.key());
  }
  for (const auto& outer : prebuilt) {
    for (const auto& path : unit_paths) {
      LOCKSTEP_CHECK(path.rfind(outer + ".", 0) != 0, "FSDP: the wrap policy picked '", path, "' inside '", outer,
                     "', which was sharded while building (shard_when_built) as one unit; change the policy so it "
                     "picks nothing inside it");
    }
  }
}

struct FullyShardedDataParallel::SequentialEntry {
  torch::nn::SequentialImpl* sequential;
  size_t index;
  torch::nn::AnyModule original;
};

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group, FSDPOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  LOCKSTEP_CHECK(module_ != nullptr, "FullyShardedDataParallel needs a module");
  if (!group) group = world();
  LOCKSTEP_CHECK(group != nullptr, "FullyShardedDataParallel needs an initialised process group "
                 "(call lockstep::init_from_env() or init_process_group() first)");
  const std::string name = group->name() + "." + next_group_name("fsdp");
  // The units' collectives go over the group's own connections, in its
  // order; the step check's exchange is in flight between them, so it is a
  // side channel (Note [One mesh per process], Note [FSDP's step check]).
  group_ = group->view(name);
  step_check_ = std::make_unique<fsdp::StepCheck>(group_->size() > 1 ? group_->side_channel(name + ".check")
                                                                       : nullptr);

  const int world_size = group_->size();
  switch (options_.sharding_strategy()) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
      shard_group_ = group_;
      break;
    case ShardingStrategy::kNoShard:
      replicate_group_ = group_;
      break;
    case ShardingStrategy::kHybridShard: {
      const int size = hybrid_shard_group_size(options_, *group);
      const int rank = group_->rank();
      const int block = rank / size;
      std::vector<int> shard_ranks, replica_ranks;
      for (int i = 0; i < size; ++i) shard_ranks.push_back(block * size + i);
      for (int b = 0; b < world_size / size; ++b) replica_ranks.push_back(b * size + rank % size);
      shard_group_ = group_->new_group(shard_ranks, name + ".shard" + std::to_string(block));
      replicate_group_ = group_->new_group(replica_ranks, name + ".replica" + std::to_string(rank % size));
      logger().info("FSDP HYBRID_SHARD: rank {} shards with ranks {} and replicates with ranks {}",
                    get_rank(), format_ranks(shard_group_->global_ranks()),
                    format_ranks(replicate_group_->global_ranks()));
      break;
    }
  }
  if (replicate_group_ && replicate_group_->size() > 1) {
    configure_hierarchical_all_reduce(*replicate_group_, options_.hierarchical_all_reduce(), 0, "FSDP");
  }

  verify_same_model_on_every_rank();
  if (options_.device_id()) move_unsharded_to(*options_.device_id());
  if (options_.sync_module_states()) sync_module_states();
  std::vector<std::string> unit_paths;
  if (options_.auto_wrap_policy()) unit_paths = select_units(*module_, *options_.auto_wrap_policy());
  add_prebuilt_units(unit_paths);
  // Unit by unit: flattened, moved to the device, synchronised, sharded and
  // freed; from here on each rank holds its shards only (and the root).
  build_units(unit_paths);
  intercept_sequential_entries();
  for (const auto& unit : units_) {
    if (!unit->path().empty()) fsdp::detail::register_unit(unit->module(), this, unit->index());
    if (options_.use_orig_params()) unit->expose_orig_params();
  }
  reset_peak_stats();
  if (group_->rank() == 0) {
    int64_t largest = 0;
    for (const auto& unit : units_) largest = std::max(largest, unit->numel());
    logger().info("FSDP {}: {} unit(s) over {} rank(s) (shard group of {}), largest {} parameters, policy {}{}",
                  to_string(options_.sharding_strategy()), units_.size(), world_size,
                  shard_group_ ? shard_group_->size() : 1, largest,
                  options_.auto_wrap_policy() ? options_.auto_wrap_policy()->describe() : "none",
                  prebuilt_units_ > 0 ? str_cat("; ", prebuilt_units_, " sharded while the model was built") : "");
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  fsdp::detail::unregister_units(this);
  restore_sequential_entries();
}

void FullyShardedDataParallel::verify_same_model_on_every_rank() {
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& item : module_->named_parameters(true)) {
    mine.push_back({"parameter " + item.key(), c10::toString(item.value().scalar_type()), item.value().sizes().vec(),
                    item.value().requires_grad()});
  }
  for (const auto& item : module_->named_buffers(true)) {
    mine.push_back({"buffer " + item.key(), c10::toString(item.value().scalar_type()), item.value().sizes().vec(),
                    false});
  }
  // Whether a unit was sharded while building decides which collectives build it.
  for (const auto& item : module_->named_modules("", /*include_self=*/false)) {
    if (fsdp::has_prebuilt_shard(item.value().get())) mine.push_back({"unit sharded while building " + item.key()});
  }
  const auto all = all_gather_object(mine, group_);
  for (int r = 1; r < group_->size(); ++r) {
    const auto& other = all[static_cast<size_t>(r)];
    if (other == all.front()) continue;
    const auto& reference = all.front();
    const size_t common = std::min(reference.size(), other.size());
    for (size_t i = 0; i < common; ++i) {
      if (reference[i] == other[i]) continue;
      LOCKSTEP_FAIL("FSDP: ranks hold different models: entry #", i, " is ", reference[i].dump(), " on rank ",
                    group_->global_rank(0), " but ", other[i].dump(), " on rank ", group_->global_rank(r),
                    " ([name, dtype, shape, requires_grad])");
    }
    LOCKSTEP_FAIL("FSDP: rank ", group_->global_rank(0), " has ", reference.size(), " parameters and buffers but rank ",
                  group_->global_rank(r), " has ", other.size());
  }
}

// Buffers and frozen parameters are not sharded: they move whole.
void FullyShardedDataParallel::move_unsharded_to(const torch::Device& device) {
  torch::NoGradGuard no_grad;
  auto move = [&](torch::Tensor tensor) {
    if (tensor.device() != device) tensor.set_data(tensor.detach().to(device));
  };
  for (const auto& item : module_->named_parameters(true)) {
    if (!item.value().requires_grad()) move(item.value());
  }
  for (const auto& item : module_->named_buffers(true)) move(item.value());
}

// Rank 0's buffers and frozen parameters; the trainable parameters are
// broadcast a unit at a time as their flat parameter is built (UnitSetup::sync_group).
void FullyShardedDataParallel::sync_module_states() {
  if (group_->size() == 1) return;
  torch::NoGradGuard no_grad;
  std::unordered_set<const void*> seen;
  auto broadcast = [&](torch::Tensor tensor) {
    if (!seen.insert(tensor.unsafeGetTensorImpl()).second) return;
    torch::Tensor data = tensor.detach();
    group_->broadcast(data, 0);
  };
  for (const auto& item : module_->named_parameters(true)) {
    if (!item.value().requires_grad()) broadcast(item.value());
  }
  for (const auto& item : module_->named_buffers(true)) broadcast(item.value());
}

// Note [The root unit]
// The model itself is the root, the unit of path "" (paths[0] below; named
// "flat_param" in state dicts and by named_shard_parameters): it holds every
// trainable parameter no unit claimed, and a parameter tied across units goes
// to their common ancestor, which may be the root. With no wrap policy it is
// the only unit; when it holds no trainable parameter of its own there is no
// root unit. FSDP is never told when the root's parameters are used: its
// forward is the model's own, it is no Sequential entry, and it is not
// registered for unit_scope (opened on it, the scope does nothing). So its
// parameters must be usable at any time, and the root is persistent, as every
// unit is under NO_SHARD: gathered when built and never freed (reshard does
// nothing), and left out of the interception check and of
// max_gathered_units(). Like any unit it has a shard (the whole flat parameter
// under NO_SHARD), which the optimizer steps: its gradients are reduced into
// the shard like any unit's, once those the loss reached are in (no
// pre-backward hook gathers it, and none is needed). Its gathered copy
// therefore outlives every step and goes stale when the shard changes: it is
// refreshed (re-gathered, a collective) after every optimizer step
// (after_step) and, when stale, before every forward (begin_forward); see
// Note [Shard staleness]. It costs its whole parameters on every rank besides
// its shard, so keep it small (embeddings, heads); a model built under
// shard_when_built builds the root whole.
void FullyShardedDataParallel::build_units(const std::vector<std::string>& unit_paths) {
  std::map<std::string, torch::nn::Module*> modules;
  for (const auto& item : module_->named_modules("", /*include_self=*/true)) modules[item.key()] = item.value().get();

  // Each parameter belongs to the deepest unit that contains every name it
  // has (tied parameters shared across units go to their common ancestor).
  std::vector<std::string> paths{""};
  paths.insert(paths.end(), unit_paths.begin(), unit_paths.end());
  std::vector<std::vector<fsdp::FlatSlot>> slots(paths.size());
  std::unordered_map<const void*, std::vector<std::string>> names_of;
  std::vector<torch::Tensor> order;
  for (const auto& item : module_->named_parameters(true)) {
    auto& names = names_of[item.value().unsafeGetTensorImpl()];
    if (names.empty()) order.push_back(item.value());
    names.push_back(item.key());
  }
  std::unordered_set<const void*> buffer_seen;
  for (const auto& item : module_->named_buffers(true)) {
    buffers_.emplace_back(item.key(), item.value());
    buffer_dtypes_[item.key()] = item.value().scalar_type();
    if (buffer_seen.insert(item.value().unsafeGetTensorImpl()).second && options_.mixed_precision().buffer_dtype() &&
        item.value().is_floating_point()) {
      torch::Tensor buffer = item.value();
      buffer.set_data(buffer.detach().to(*options_.mixed_precision().buffer_dtype()));
    }
  }
  for (const auto& param : order) {
    const auto& names = names_of[param.unsafeGetTensorImpl()];
    if (!param.requires_grad()) {
      for (const auto& name : names) frozen_.emplace_back(name, param);
      continue;
    }
    size_t owner = 0;
    size_t owner_depth = 0;
    for (size_t u = 1; u < paths.size(); ++u) {
      bool all_inside = true;
      for (const auto& name : names) all_inside = all_inside && path_contains(paths[u], name);
      const size_t depth = static_cast<size_t>(std::count(paths[u].begin(), paths[u].end(), '.')) + 1;
      if (all_inside && depth > owner_depth) {
        owner = u;
        owner_depth = depth;
      }
    }
    fsdp::FlatSlot slot;
    slot.name = names.front();
    slot.aliases.assign(names.begin() + 1, names.end());
    slot.param = param;
    slot.model_index = trainable_count_++;
    slots[owner].push_back(std::move(slot));
  }

  const auto& precision = options_.mixed_precision();
  // Factors of the whole group's size, not the shard group's (Note [FSDP's pre- and post-divide]).
  const auto [predivide, postdivide] = fsdp::gradient_divide_factors(group_->size());
  for (size_t u = 0; u < paths.size(); ++u) {
    if (slots[u].empty()) {
      if (u > 0) logger().warn("FSDP unit {} holds no trainable parameters of its own; it is not sharded", display(paths[u]));
      continue;
    }
    const torch::Tensor& first = slots[u].front().param;
    fsdp::UnitSetup setup;
    setup.shard_group = shard_group_;
    setup.replicate_group = replicate_group_;
    setup.param_dtype = precision.param_dtype().value_or(first.scalar_type());
    setup.reduce_dtype = precision.reduce_dtype().value_or(setup.param_dtype);
    setup.compute_device = options_.device_id().value_or(first.device());
    setup.shard_device = options_.offload_params() ? torch::Device(torch::kCPU) : setup.compute_device;
    setup.persistent = u == 0 || options_.sharding_strategy() == ShardingStrategy::kNoShard;
    setup.predivide = predivide;
    setup.postdivide = postdivide;
    setup.step_check = step_check_.get();
    if (options_.sync_module_states() && group_->size() > 1) setup.sync_group = group_;
    const int index = static_cast<int>(units_.size());
    torch::Tensor prebuilt;
    if (auto cut = fsdp::take_prebuilt_shard(modules.at(paths[u]))) {
      prebuilt = checked_prebuilt_shard(paths[u], slots[u], *cut);
      prebuilt_units_ += 1;
    }
    units_.push_back(std::make_unique<fsdp::FlatParamUnit>(index, paths[u], modules.at(paths[u]),
                                                           std::move(slots[u]), setup, prebuilt));
    // Freed before the next unit is built: the model's own storage for these
    // parameters went when they were pointed at the flat parameter.
    if (!units_.back()->persistent()) units_.back()->reshard();
    UnitRun run;
    run.slot_ready.assign(units_.back()->slots().size(), 0);
    run.slot_in_graph.assign(units_.back()->slots().size(), 1);
    runs_.push_back(std::move(run));
    install_gradient_hooks(*units_.back());
  }
}

// The shard cut while building, if it was cut for this FSDP's layout of the unit.
torch::Tensor FullyShardedDataParallel::checked_prebuilt_shard(const std::string& path,
                                                               const std::vector<fsdp::FlatSlot>& slots,
                                                               const fsdp::PrebuiltShard& cut) const {
  const int shard_rank = shard_group_ ? shard_group_->rank() : 0;
  const int shard_world = shard_group_ ? shard_group_->size() : 1;
  LOCKSTEP_CHECK(cut.plan.shard_rank == shard_rank && cut.plan.shard_world == shard_world, "FSDP unit '", path,
                 "' was sharded while building as shard ", cut.plan.shard_rank, " of ", cut.plan.shard_world,
                 ", but this FSDP holds shard ", shard_rank, " of ", shard_world,
                 " (build it under FullyShardedDataParallel::shard_plan() of the same options and group)");
  std::string built, here;
  for (const auto& [name, shape] : cut.params) built += " " + path + "." + name + shape_text(shape);
  for (const auto& slot : slots) here += " " + slot.name + shape_text(slot.param.sizes());
  LOCKSTEP_CHECK(built == here, "FSDP unit '", path, "' was sharded while building with the parameters", built,
                 " but FSDP's unit holds", here.empty() ? " none" : here,
                 ": a unit built by shard_when_built must own all its trainable parameters (none tied to the rest "
                 "of the model)");
  return cut.shard;
}

void FullyShardedDataParallel::install_gradient_hooks(fsdp::FlatParamUnit& unit) {
  const int index = unit.index();
  for (size_t s = 0; s < unit.slots().size(); ++s) {
    unit.hooks().push_back(std::make_unique<compat::PostAccumulateHook>(
        unit.slots()[s].param, [this, index, s] { on_grad_ready(index, s); }));
  }
}

void FullyShardedDataParallel::intercept_sequential_entries() {
  std::map<std::string, torch::nn::Module*> modules;
  for (const auto& item : module_->named_modules("", /*include_self=*/true)) modules[item.key()] = item.value().get();
  for (const auto& unit : units_) {
    if (unit->path().empty()) continue;
    const auto dot = unit->path().rfind('.');
    const std::string parent = dot == std::string::npos ? "" : unit->path().substr(0, dot);
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(modules.at(parent));
    if (sequential == nullptr) continue;
    size_t index = 0;
    for (auto& entry : *sequential) {
      if (entry.ptr().get() == unit->module()) {
        const auto& precision = options_.mixed_precision();
        auto wrapper = std::make_shared<UnitEntryImpl>(
            entry, unit->module(), unit->path(),
            precision.cast_forward_inputs() ? precision.param_dtype() : c10::optional<torch::Dtype>());
        sequential_entries_.push_back(std::make_unique<SequentialEntry>(SequentialEntry{sequential, index, entry}));
        entry = torch::nn::AnyModule(wrapper);
      }
      ++index;
    }
  }
}

void FullyShardedDataParallel::restore_sequential_entries() {
  for (auto& saved : sequential_entries_) {
    auto it = saved->sequential->begin() + static_cast<std::ptrdiff_t>(saved->index);
    *it = saved->original;
  }
  sequential_entries_.clear();
}

void FullyShardedDataParallel::check_interception() const {
  std::vector<std::string> missing;
  for (const auto& unit : units_) {
    if (!unit->path().empty() && !unit->persistent() && !runs_[static_cast<size_t>(unit->index())].entered_ever) {
      missing.push_back(unit->path() + " (" + unit->module()->name() + ")");
    }
  }
  if (missing.empty()) return;
  std::string list;
  for (const auto& entry : missing) list += "\n  " + entry;
  LOCKSTEP_FAIL("FSDP on rank ", group_->global_rank(group_->rank()), ": the forward pass did not go through ",
                missing.size(), " unit(s) the wrap policy chose:", list,
                "\nFSDP cannot see a module's forward by itself (libtorch has no forward hooks), and these "
                "parameters would go stale. Either put the module in a torch::nn::Sequential (FSDP intercepts "
                "its entries), or open `auto scope = lockstep::fsdp::unit_scope(*this);` in its forward and "
                "return `scope.output(y)`. If the module is simply unused, change the wrap policy so it is no unit.");
}

}  // namespace lockstep
