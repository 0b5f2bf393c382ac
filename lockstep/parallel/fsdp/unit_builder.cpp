// fsdp::UnitBuilder: FullyShardedDataParallel's setup, from the groups to
// the units' shards and the Sequential entries that intercept their forwards.
// The per-iteration runtime is in step_runtime.cpp.
#include "lockstep/parallel/fsdp/internal/unit_builder.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <torch/nn/modules/container/sequential.h>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/shape_text.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/hierarchy.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/model/batch.h"
#include "lockstep/parallel/fsdp/unit_scope.h"
#include "lockstep/parallel/fsdp/wrap_policy.h"

namespace lockstep::fsdp {
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
    auto scope = unit_scope(*unit_);
    input = scope.input(cast_floating(input, input_dtype_));
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

int UnitBuilder::hybrid_shard_group_size(const FSDPOptions& options, const ProcessGroup& group) {
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
  LOCKSTEP_CHECK(options.hybrid_replicas() == 0 || options.hybrid_replicas() * size == group.size(),
                 "FullyShard: the mesh [", options.hybrid_replicas(), ", ", size, "] holds ",
                 options.hybrid_replicas() * size, " ranks, but the job has ", group.size());
  return size;
}

ShardPlan UnitBuilder::shard_plan(const FSDPOptions& options, std::shared_ptr<ProcessGroup> group,
                                                     torch::Device compute_device) {
  if (!group) group = world();
  LOCKSTEP_CHECK(group != nullptr, "FSDP shard_plan needs an initialised process group");
  ShardPlan plan;
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
void UnitBuilder::add_prebuilt_units(std::vector<std::string>& unit_paths) const {
  const std::set<std::string> chosen(unit_paths.begin(), unit_paths.end());
  std::vector<std::string> prebuilt;
  unit_paths.clear();
  for (const auto& item : model_.module->named_modules("", /*include_self=*/false)) {
    const bool cut = has_prebuilt_shard(item.value().get());
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

struct UnitBuilder::SequentialEntry {
  torch::nn::SequentialImpl* sequential;
  size_t index;
  torch::nn::AnyModule original;
};

// Note [Whose reduce-scatter]
// Over Gloo, lockstep's ProcessGroup reduce-scatters with its own ring over
// send/recv (comm/process_group.cpp: Gloo's native _reduce_scatter_base is an
// all-reduce and a slice, 2.2x the ring's time on 2 ranks). A sum of the same
// terms in another order may round differently: at 2 ranks a sum of two terms
// has one order, and FullyShard trains bitwise as PyTorch's fully_shard; at 3
// ranks the ring adds in Gloo's order except where Gloo's all-reduce cuts the
// buffer elsewhere than at the ranks' shards: in the differential case
// FullyShard_AdamW_Accumulation_3ranks, on the ring, one element of 25120 in
// the largest unit (the first of rank 2's shard of head.1.weight) differed by
// one rounding from AdamW's second step, 6.7e-8 relative after 20 steps (the
// other 3-rank cases come out bitwise on their values); at 4 ranks Gloo's
// all-reduce adds in another order, and after 20 SGD steps the weights differ
// by up to 9.3e-7 relative (FullyShard_4ranks). native_reduce_scatter (FullyShard's
// `reduce_scatter: native`) runs the backend's own op, PyTorch's call:
// bitwise at every world size (FullyShard_ReshardAfterForward2_4ranks), at
// the native op's speed. It is set on the shard group, the one group that
// reduce-scatters (HSDP's replicas all-reduce).
void UnitBuilder::make_groups(ShardedModel& model, const std::shared_ptr<ProcessGroup>& group,
                              const std::string& name) {
  // The units' collectives go over the group's own connections, in its order
  // (Note [One mesh per process]).
  model.group = group->view(name);
  const int world_size = model.group->size();
  switch (model.options.sharding_strategy()) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
      model.shard_group = model.group;
      break;
    case ShardingStrategy::kNoShard:
      model.replicate_group = model.group;
      break;
    case ShardingStrategy::kHybridShard: {
      const int size = hybrid_shard_group_size(model.options, *group);
      const int rank = model.group->rank();
      const int block = rank / size;
      std::vector<int> shard_ranks, replica_ranks;
      for (int i = 0; i < size; ++i) shard_ranks.push_back(block * size + i);
      for (int b = 0; b < world_size / size; ++b) replica_ranks.push_back(b * size + rank % size);
      model.shard_group = model.group->new_group(shard_ranks, name + ".shard" + std::to_string(block));
      model.replicate_group = model.group->new_group(replica_ranks, name + ".replica" + std::to_string(rank % size));
      logger().info("FSDP HYBRID_SHARD: rank {} shards with ranks {} and replicates with ranks {}", get_rank(),
                    format_ranks(model.shard_group->global_ranks()),
                    format_ranks(model.replicate_group->global_ranks()));
      break;
    }
  }
  if (const int k = model.options.reshard_after_forward_to(); k > 0) {
    LOCKSTEP_CHECK(model.options.per_parameter_sharding() &&
                       model.options.sharding_strategy() == ShardingStrategy::kFullShard,
                   "reshard_after_forward: ", k, " needs FullyShard with a 1-D mesh (resharding after forward)");
    LOCKSTEP_CHECK(k > 1 && k < world_size && world_size % k == 0, "FullyShard: reshard_after_forward: ", k,
                   " must divide the world size ", world_size, " and lie strictly between 1 and it (true: all ",
                   world_size, " ranks; false: keep the parameters)");
    const int block = model.group->rank() / k;
    std::vector<int> ranks;
    for (int i = 0; i < k; ++i) ranks.push_back(block * k + i);
    model.post_forward_group = model.group->new_group(ranks, name + ".post_forward" + std::to_string(block));
  }
  if (model.options.native_reduce_scatter() && model.shard_group) {  // Note [Whose reduce-scatter]
    model.shard_group->set_algorithms({CollectiveAlgorithm::kNative, CollectiveAlgorithm::kAuto});
  }
  if (model.replicate_group && model.replicate_group->size() > 1) {
    configure_hierarchical_all_reduce(*model.replicate_group, model.options.hierarchical_all_reduce(), 0, "FSDP");
  }
}

UnitBuilder::UnitBuilder(ShardedModel& model, StepCheck* step_check, GradReady grad_ready)
    : model_(model), step_check_(step_check), grad_ready_(std::move(grad_ready)) {}

UnitBuilder::~UnitBuilder() { restore_sequential_entries(); }

void UnitBuilder::build() {
  verify_same_model_on_every_rank();
  if (model_.options.device_id()) move_unsharded_to(*model_.options.device_id());
  if (model_.options.sync_module_states()) sync_module_states();
  std::vector<std::string> unit_paths;
  if (model_.options.auto_wrap_policy()) unit_paths = select_units(*model_.module, *model_.options.auto_wrap_policy());
  add_prebuilt_units(unit_paths);
  // Unit by unit: flattened, moved to the device, synchronised, sharded and
  // freed; from here on each rank holds its shards only (and the root).
  build_units(unit_paths);
  intercept_sequential_entries();
  for (const auto& unit : model_.units) {
    if (model_.options.use_orig_params()) unit->gradients().expose_orig_params();
  }
}

void UnitBuilder::verify_same_model_on_every_rank() {
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& item : model_.module->named_parameters(true)) {
    mine.push_back({"parameter " + item.key(), c10::toString(item.value().scalar_type()), item.value().sizes().vec(),
                    item.value().requires_grad()});
  }
  for (const auto& item : model_.module->named_buffers(true)) {
    mine.push_back({"buffer " + item.key(), c10::toString(item.value().scalar_type()), item.value().sizes().vec(),
                    false});
  }
  // Whether a unit was sharded while building decides which collectives build it.
  for (const auto& item : model_.module->named_modules("", /*include_self=*/false)) {
    if (has_prebuilt_shard(item.value().get())) mine.push_back({"unit sharded while building " + item.key()});
  }
  const auto all = all_gather_object(mine, model_.group);
  for (int r = 1; r < model_.group->size(); ++r) {
    const auto& other = all[static_cast<size_t>(r)];
    if (other == all.front()) continue;
    const auto& reference = all.front();
    const size_t common = std::min(reference.size(), other.size());
    for (size_t i = 0; i < common; ++i) {
      if (reference[i] == other[i]) continue;
      LOCKSTEP_FAIL("FSDP: ranks hold different models: entry #", i, " is ", reference[i].dump(), " on rank ",
                    model_.group->global_rank(0), " but ", other[i].dump(), " on rank ", model_.group->global_rank(r),
                    " ([name, dtype, shape, requires_grad])");
    }
    LOCKSTEP_FAIL("FSDP: rank ", model_.group->global_rank(0), " has ", reference.size(),
                  " parameters and buffers but rank ", model_.group->global_rank(r), " has ", other.size());
  }
}

// Buffers and frozen parameters are not sharded: they move whole.
void UnitBuilder::move_unsharded_to(const torch::Device& device) {
  torch::NoGradGuard no_grad;
  auto move = [&](torch::Tensor tensor) {
    if (tensor.device() != device) tensor.set_data(tensor.detach().to(device));
  };
  for (const auto& item : model_.module->named_parameters(true)) {
    if (!item.value().requires_grad()) move(item.value());
  }
  for (const auto& item : model_.module->named_buffers(true)) move(item.value());
}

// Rank 0's buffers and frozen parameters; the trainable parameters are
// broadcast a unit at a time as their flat parameter is built (UnitSetup::sync_group).
void UnitBuilder::sync_module_states() {
  if (model_.group->size() == 1) return;
  torch::NoGradGuard no_grad;
  std::unordered_set<const void*> seen;
  auto broadcast = [&](torch::Tensor tensor) {
    if (!seen.insert(tensor.unsafeGetTensorImpl()).second) return;
    torch::Tensor data = tensor.detach();
    model_.group->broadcast(data, 0);
  };
  for (const auto& item : model_.module->named_parameters(true)) {
    if (!item.value().requires_grad()) broadcast(item.value());
  }
  for (const auto& item : model_.module->named_buffers(true)) broadcast(item.value());
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
// memory_stats().max_gathered_units. Like any unit it has a shard (the whole flat parameter
// under NO_SHARD), which the optimizer steps: its gradients are reduced into
// the shard like any unit's, once those the loss reached are in (no
// pre-backward hook gathers it, and none is needed). Its gathered copy
// therefore outlives every step and goes stale when the shard changes: it is
// refreshed (re-gathered, a collective) after every optimizer step
// (after_step) and, when stale, before every forward (begin_forward); see
// Note [Shard staleness]. It costs its whole parameters on every rank besides
// its shard, so keep it small (embeddings, heads); a model built under
// shard_when_built builds the root whole.
void UnitBuilder::build_units(const std::vector<std::string>& unit_paths) {
  std::map<std::string, torch::nn::Module*> modules;
  for (const auto& item : model_.module->named_modules("", /*include_self=*/true))
    modules[item.key()] = item.value().get();
  std::vector<std::string> paths{""};
  paths.insert(paths.end(), unit_paths.begin(), unit_paths.end());
  record_buffers();
  std::vector<std::vector<FlatSlot>> slots = assign_parameters(paths);

  // Factors of the whole group's size, not the shard group's (Note [FSDP's pre- and post-divide]).
  const auto [predivide, postdivide] = gradient_divide_factors(model_.group->size());
  for (size_t u = 0; u < paths.size(); ++u) {
    if (slots[u].empty()) {
      if (u > 0) {
        logger().warn("FSDP unit {} holds no trainable parameters of its own; it is not sharded", display(paths[u]));
      }
      continue;
    }
    const int leader = static_cast<int>(model_.units.size());
    for (auto& part : split_by_dtype(std::move(slots[u]), paths[u])) {
      const int index = static_cast<int>(model_.units.size());
      UnitSetup setup = unit_setup(/*root=*/u == 0, part.front().param, predivide, postdivide);
      if (setup.per_parameter) {
        const int shards = model_.shard_group ? model_.shard_group->size() : 1;
        const DivideFactors factors =
            fully_shard_divide_factors(shards, model_.group->size() / shards, setup.reduce_dtype);
        setup.predivide = factors.predivide;
        setup.shard_postdivide = factors.shard_postdivide;
        setup.postdivide = factors.postdivide;
      }
      torch::Tensor prebuilt;
      if (auto cut = take_prebuilt_shard(modules.at(paths[u]))) {
        LOCKSTEP_CHECK(!setup.per_parameter, "FSDP unit ", display(paths[u]),
                       " was sharded while building (shard_when_built), in FSDP1's flat layout; FullyShard shards "
                       "each parameter on its own: build the model whole (without shard_when_built) to wrap it with "
                       "FullyShard");
        prebuilt = checked_prebuilt_shard(paths[u], part, *cut);
        model_.prebuilt_units += 1;
      }
      // A companion is named by its dtype: "blocks.0[BFloat16]" (state dict keys, messages).
      const std::string path =
          index == leader ? paths[u] : str_cat(paths[u], "[", c10::toString(part.front().param.scalar_type()), "]");
      model_.units.push_back(
          std::make_unique<FlatParamUnit>(index, path, modules.at(paths[u]), std::move(part), setup, prebuilt));
      model_.leader_of.push_back(leader);
      model_.companions.emplace_back();
      if (index != leader) model_.companions[static_cast<size_t>(leader)].push_back(index);
      // Freed before the next unit is built: the model's own storage for these
      // parameters went when they were pointed at the flat parameter.
      if (!model_.units.back()->setup().persistent) model_.units.back()->reshard();
      install_gradient_hooks(*model_.units.back());
    }
  }
}

// Note [A unit of several dtypes]
// fully_shard lets one module hold parameters of several dtypes -- LoRA with
// the base weights frozen in bf16 and the adapters trained in fp32 -- and
// all-gathers them together as bytes. A FlatParamUnit's buffers have one
// dtype, so FullyShard cuts such a module into one unit per dtype: the
// leader, which holds the trainable parameters (their gradients are reduced
// in one dtype, as fully_shard's reduce-scatter requires), and companions
// holding the frozen parameters of each other dtype. Companions are not
// units of their own to the runtime: they are gathered when their leader is,
// freed when it is, and their leader ends its backward only when its inputs'
// gradients are in (Note [A unit with frozen parameters]), since a frozen
// weight may be needed after every trainable gradient is ready. Each
// part's all-gather copies its bits, so the parameters are exactly
// fully_shard's; the price is one all-gather per dtype instead of one.
// Without per-parameter sharding (FSDP1) frozen parameters are not sharded
// at all, and a unit keeps one dtype.
std::vector<std::vector<FlatSlot>> UnitBuilder::split_by_dtype(std::vector<FlatSlot> slots,
                                                               const std::string& path) const {
  if (!model_.options.per_parameter_sharding()) return {std::move(slots)};
  auto trainable = std::find_if(slots.begin(), slots.end(), [](const FlatSlot& slot) { return slot.trainable; });
  const FlatSlot& first = trainable != slots.end() ? *trainable : slots.front();
  const std::string first_name = first.name;  // the slots move below
  const torch::Dtype leader_dtype = first.param.scalar_type();
  std::vector<std::vector<FlatSlot>> parts(1);
  std::vector<torch::Dtype> dtypes{leader_dtype};
  for (auto& slot : slots) {
    const torch::Dtype dtype = slot.param.scalar_type();
    LOCKSTEP_CHECK(dtype == leader_dtype || !slot.trainable, "FullyShard unit ", display(path), " trains ",
                   first_name, " in ", leader_dtype, " and ", slot.name, " in ", dtype,
                   ": the trainable parameters of a unit share one dtype (their gradients are reduced together, as "
                   "fully_shard's reduce-scatter requires); convert one, or wrap them in different units "
                   "(frozen parameters may have any dtype)");
    const size_t part = static_cast<size_t>(std::find(dtypes.begin(), dtypes.end(), dtype) - dtypes.begin());
    if (part == dtypes.size()) {
      dtypes.push_back(dtype);
      parts.emplace_back();
    }
    parts[part].push_back(std::move(slot));
  }
  return parts;
}

// The model's buffers, by name with their own dtype (state dicts save them in
// it); under mixed precision's buffer_dtype, floating-point ones are cast.
void UnitBuilder::record_buffers() {
  std::unordered_set<const void*> buffer_seen;
  for (const auto& item : model_.module->named_buffers(true)) {
    model_.buffers.emplace_back(item.key(), item.value());
    model_.buffer_dtypes[item.key()] = item.value().scalar_type();
    if (buffer_seen.insert(item.value().unsafeGetTensorImpl()).second &&
        model_.options.mixed_precision().buffer_dtype() && item.value().is_floating_point()) {
      torch::Tensor buffer = item.value();
      buffer.set_data(buffer.detach().to(*model_.options.mixed_precision().buffer_dtype()));
    }
  }
}

// Each trainable parameter's slot in the unit of `paths` it belongs to: the
// deepest unit that contains every name it has (tied parameters shared
// across units go to their common ancestor, the root "" at worst). Frozen
// parameters go to model_.frozen.
std::vector<std::vector<FlatSlot>> UnitBuilder::assign_parameters(const std::vector<std::string>& paths) {
  std::vector<std::vector<FlatSlot>> slots(paths.size());
  std::unordered_map<const void*, std::vector<std::string>> names_of;
  std::vector<torch::Tensor> order;
  for (const auto& item : model_.module->named_parameters(true)) {
    auto& names = names_of[item.value().unsafeGetTensorImpl()];
    if (names.empty()) order.push_back(item.value());
    names.push_back(item.key());
  }
  for (const auto& param : order) {
    const auto& names = names_of[param.unsafeGetTensorImpl()];
    // FullyShard shards frozen parameters with their unit, as fully_shard
    // does (LoRA: the frozen base weights are most of the model).
    const bool trainable = param.requires_grad();
    if (!trainable && !model_.options.per_parameter_sharding()) {
      for (const auto& name : names) model_.frozen.emplace_back(name, param);
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
    FlatSlot slot;
    slot.name = names.front();
    slot.aliases.assign(names.begin() + 1, names.end());
    slot.param = param;
    slot.trainable = trainable;
    slot.model_index = trainable ? model_.trainable_count++ : -1;
    slots[owner].push_back(std::move(slot));
  }
  return slots;
}

// How a unit whose first parameter is `first` is built: its groups, dtypes,
// devices, whether it stays gathered (the root, see Note [The root unit], and
// every unit under NO_SHARD) and its gradients' divide factors.
UnitSetup UnitBuilder::unit_setup(bool root, const torch::Tensor& first, double predivide, double postdivide) const {
  const auto& precision = model_.options.mixed_precision();
  UnitSetup setup;
  setup.shard_group = model_.shard_group;
  setup.replicate_group = model_.replicate_group;
  setup.param_dtype = precision.param_dtype().value_or(first.scalar_type());
  setup.reduce_dtype = precision.reduce_dtype().value_or(setup.param_dtype);
  setup.compute_device = model_.options.device_id().value_or(first.device());
  setup.shard_device = model_.options.offload_params() ? torch::Device(torch::kCPU) : setup.compute_device;
  setup.persistent = root || model_.options.sharding_strategy() == ShardingStrategy::kNoShard;
  setup.predivide = predivide;
  setup.postdivide = postdivide;
  setup.per_parameter = model_.options.per_parameter_sharding();
  setup.post_forward_group = model_.post_forward_group;
  setup.step_check = step_check_;
  if (model_.options.sync_module_states() && model_.group->size() > 1) setup.sync_group = model_.group;
  return setup;
}

// The shard cut while building, if it was cut for this FSDP's layout of the unit.
torch::Tensor UnitBuilder::checked_prebuilt_shard(const std::string& path,
                                                               const std::vector<FlatSlot>& slots,
                                                               const PrebuiltShard& cut) const {
  const int shard_rank = model_.shard_group ? model_.shard_group->rank() : 0;
  const int shard_world = model_.shard_group ? model_.shard_group->size() : 1;
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

void UnitBuilder::install_gradient_hooks(FlatParamUnit& unit) {
  const int index = unit.index();
  for (size_t s = 0; s < unit.slots().size(); ++s) {
    if (!unit.slots()[s].trainable) {
      unit.hooks().push_back(nullptr);  // autograd never produces its gradient
      continue;
    }
    unit.hooks().push_back(std::make_unique<compat::PostAccumulateHook>(
        unit.slots()[s].param, [this, index, s] { grad_ready_(index, s); }));
  }
}

void UnitBuilder::intercept_sequential_entries() {
  std::map<std::string, torch::nn::Module*> modules;
  for (const auto& item : model_.module->named_modules("", /*include_self=*/true))
    modules[item.key()] = item.value().get();
  for (const auto& unit : model_.units) {
    if (unit->path().empty() || model_.is_companion(unit->index())) continue;
    const auto dot = unit->path().rfind('.');
    const std::string parent = dot == std::string::npos ? "" : unit->path().substr(0, dot);
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(modules.at(parent));
    if (sequential == nullptr) continue;
    size_t index = 0;
    for (auto& entry : *sequential) {
      if (entry.ptr().get() == unit->module()) {
        const auto& precision = model_.options.mixed_precision();
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

void UnitBuilder::restore_sequential_entries() {
  for (auto& saved : sequential_entries_) {
    auto it = saved->sequential->begin() + static_cast<std::ptrdiff_t>(saved->index);
    *it = saved->original;
  }
  sequential_entries_.clear();
}

}  // namespace lockstep::fsdp
