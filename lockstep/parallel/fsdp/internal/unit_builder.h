// fsdp::UnitBuilder: FullyShardedDataParallel's setup. It makes the shard and
// replicate groups, checks that every rank holds the same model, cuts the
// model into units by the wrap policy (and the units sharded while it was
// built), builds each unit's flat parameter and shard, and puts a forwarding
// entry in place of each unit that is an entry of a torch::nn::Sequential.
// While it lives, those entries stay replaced; its destructor puts the
// originals back.
//
//   fsdp::ShardedModel model{module, options};
//   fsdp::UnitBuilder::make_groups(model, group, name);
//   fsdp::UnitBuilder builder(model, step_check, [&](int unit, size_t slot) { runtime.on_grad_ready(unit, slot); });
//   builder.build();
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>

#include "lockstep/parallel/fsdp/internal/sharded_model.h"
#include "lockstep/parallel/fsdp/shard_while_building.h"

namespace lockstep::fsdp {

class UnitBuilder {
 public:
  // Called when autograd has accumulated the gradient of a unit's slot.
  using GradReady = std::function<void(int unit, size_t slot)>;

  // The shard group's size under HYBRID_SHARD: hybrid_shard_size, or the node's ranks.
  static int hybrid_shard_group_size(const FSDPOptions& options, const ProcessGroup& group);
  // How FSDP over `group` with `options` shards each unit (FullyShardedDataParallel::shard_plan).
  static ShardPlan shard_plan(const FSDPOptions& options, std::shared_ptr<ProcessGroup> group,
                              torch::Device compute_device);
  // Sets model.group (a view of `group` named `name`), shard_group and replicate_group.
  static void make_groups(ShardedModel& model, const std::shared_ptr<ProcessGroup>& group, const std::string& name);

  UnitBuilder(ShardedModel& model, StepCheck* step_check, GradReady grad_ready);
  ~UnitBuilder();
  C10_DISABLE_COPY_AND_ASSIGN(UnitBuilder);

  // Collective: fills model.units, frozen, buffers; each rank keeps its shards.
  void build();

 private:
  void verify_same_model_on_every_rank();
  void move_unsharded_to(const torch::Device& device);
  void sync_module_states();
  void add_prebuilt_units(std::vector<std::string>& unit_paths) const;
  void build_units(const std::vector<std::string>& unit_paths);
  void record_buffers();
  std::vector<std::vector<FlatSlot>> assign_parameters(const std::vector<std::string>& paths);
  std::vector<std::vector<FlatSlot>> split_by_dtype(std::vector<FlatSlot> slots, const std::string& path) const;
  UnitSetup unit_setup(bool root, const torch::Tensor& first, double predivide, double postdivide) const;
  torch::Tensor checked_prebuilt_shard(const std::string& path, const std::vector<FlatSlot>& slots,
                                       const PrebuiltShard& cut) const;
  void install_gradient_hooks(FlatParamUnit& unit);
  void intercept_sequential_entries();
  void restore_sequential_entries();

  ShardedModel& model_;
  StepCheck* step_check_;
  GradReady grad_ready_;
  struct SequentialEntry;
  std::vector<std::unique_ptr<SequentialEntry>> sequential_entries_;
};

}  // namespace lockstep::fsdp
