// FullyShardedDataParallel: train a model whose parameters, gradients and
// optimizer state do not fit in one process, by sharding them across ranks
// (PyTorch FSDP's behaviour and options; mmengine's MMFullyShardedDataParallel).
//
// The wrap policy cuts the model into units (wrap_policy.h); each unit's
// parameters live as one flat parameter, padded and split into one shard per
// rank (flat_param.h). A unit is gathered for its forward and (FULL_SHARD)
// again for its backward, and freed in between; its gradients are
// reduce-scattered into the shard's .grad as soon as autograd has produced
// them all. The optimizer steps the shards only, so its state is sharded too.
//
//   lockstep::init_from_env();
//   auto fsdp = std::make_shared<lockstep::FullyShardedDataParallel>(model, lockstep::world(),
//       lockstep::FSDPOptions().auto_wrap_policy(lockstep::module_type_wrap_policy({"Block"})));
//   auto optimizer = std::make_shared<lockstep::Adam>(fsdp->shard_parameters(), 1e-3);
//   auto optim = std::make_shared<lockstep::OptimWrapper>(optimizer);
//   optim->set_gradient_sync(fsdp);                   // FSDPStrategy does all of this
//   model->train_step(batch, *optim);                  // unchanged user code
//
// The contract for model authors (libtorch has no forward hooks):
//   - A unit must be intercepted when its forward runs: either it is an entry
//     of a torch::nn::Sequential (automatic), or its forward opens
//     `auto scope = lockstep::fsdp::unit_scope(*this);` and returns
//     `scope.output(y)` (unit_scope.h). Units are sharded from construction
//     on; until a unit has been intercepted once, its parameters read as NaN
//     of their own shapes (holding no memory), so a forward that bypassed
//     FSDP still runs and the backward that follows fails with an error that
//     names the unit and these two fixes.
//   - The root (the model and whatever no unit claimed) stays gathered, and is
//     refreshed after each optimizer step; keep it small (embeddings, heads).
//     See Note [The root unit] in unit_builder.cpp.
//   - Every rank runs the same units and uses the same parameters in each
//     iteration (as DDP without find_unused_parameters; checked, see
//     Note [FSDP's step check]).
//   - Read parameters outside forward through full_state_dict() or
//     summon_full_params(): between uses a sharded unit's parameters are
//     empty tensors.
//   - Parameters with requires_grad == false and buffers are not sharded;
//     they are copied from rank 0 at wrapping.
//   - Step through the OptimWrapper (it tells FSDP after each step); an
//     optimizer stepped by hand needs fsdp->after_step() before the next eval.
//
// The class is a front over three parts that share the model cut into units
// (fsdp::ShardedModel): UnitBuilder builds the units
// (unit_builder.cpp), StepRuntime moves them through each step
// (step_runtime.cpp), and StateDictCodec with Resharding converts their state
// (state_dict_codec.cpp, resharding.cpp).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/torch.h>

#include "lockstep/core/load_report.h"
#include "lockstep/core/state.h"
#include "lockstep/core/state_reader.h"
#include "lockstep/optim/gradient_sync.h"
#include "lockstep/parallel/fsdp/flat_param.h"
#include "lockstep/parallel/fsdp/fsdp_memory_stats.h"
#include "lockstep/parallel/fsdp/fsdp_options.h"
#include "lockstep/parallel/fsdp/shard_while_building.h"
#include "lockstep/parallel/fsdp/unit_scope.h"

namespace lockstep {

class ProcessGroup;

namespace fsdp {
struct ShardedModel;
class MemoryMeter;
class StepRuntime;
class StateDictCodec;
class UnitBuilder;

// The order units ran forward and began backward in the first iteration
// (FullyShardedDataParallel::execution_order()).
struct ExecutionOrder {
  std::vector<int> forward;
  std::vector<int> backward;
};
}  // namespace fsdp

class FullyShardedDataParallel : public GradientSync {
 public:
  // `group` null: the world. The model may be on its compute device, or on
  // the host with options.device_id() naming the device (then no more than
  // one unit is ever whole on the device; see FSDPOptions::device_id).
  FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group = nullptr,
                           FSDPOptions options = FSDPOptions());
  ~FullyShardedDataParallel() override;

  // How an FSDP with these options over `group` will shard each unit: what a
  // ShardWhileBuilding scope needs to cut units while the model is built
  // (shard_while_building.h). FSDPStrategy opens one around the model's
  // construction.
  static fsdp::ShardPlan shard_plan(const FSDPOptions& options, std::shared_ptr<ProcessGroup> group,
                                    torch::Device compute_device);

  // --- GradientSync -------------------------------------------------------
  void begin_forward(bool sync) override;
  void begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration) override;
  void end_backward(bool sync) override;
  torch::Tensor reduce_grad_norm(const torch::Tensor& local, double norm_type) override;
  bool clips_one_gradient_at_a_time() const override { return true; }
  bool holds_whole_gradients() const override { return false; }
  torch::Tensor any_rank_true(const torch::Tensor& local) override;
  void after_step() override;
  // A sharded step cannot be dropped on every rank (the others are inside
  // its all-gathers and reduce-scatters, and their shards move on): throws an
  // error saying so, and every later step of this FSDP throws it too.
  void step_failed(const std::exception_ptr& error, bool reduced, bool sync, int64_t iteration) override;

  // The leaves an optimizer must step: each unit's shard, named
  // "<unit path>.flat_param" ("flat_param" for the root), in unit order.
  std::vector<std::pair<std::string, torch::Tensor>> named_shard_parameters() const;
  std::vector<torch::Tensor> shard_parameters() const;
  // With use_orig_params: the leaves to step instead, one per original
  // trainable parameter, named and ordered as the model's own parameters
  // (the first name of a tied one): this rank's part of the parameter,
  // flattened, empty where it lies wholly in other ranks' shards. Build the
  // optimizer over these with paramwise_cfg as over the model under DDP.
  std::vector<std::pair<std::string, torch::Tensor>> named_orig_parameters() const;
  // After code other than the optimizer wrote into the shards (EMAHook
  // swapping its average in): gathered copies are refreshed before use.
  // Collective when a unit keeps its parameters gathered.
  void shards_changed();
  // Optimizer state counts towards memory_stats() (FSDPStrategy sets it).
  void track_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer);

  // Every parameter, whole and in full precision (the shards' dtype, not
  // mixed precision's param_dtype), while alive: collective on enter (and on
  // exit with writeback). With `writeback`, changes made to the parameters
  // are copied into the shards on exit. As PyTorch's summon_full_params.
  class FullParams {
   public:
    ~FullParams();
    C10_DISABLE_COPY_AND_ASSIGN(FullParams);

   private:
    friend class FullyShardedDataParallel;
    FullParams(FullyShardedDataParallel* fsdp, bool writeback);
    FullyShardedDataParallel* fsdp_;
    bool writeback_;
    std::vector<torch::Tensor> flats_;  // by unit
  };
  [[nodiscard]] std::unique_ptr<FullParams> summon_full_params(bool writeback = false);

  // --- state dicts (fsdp::StateDictCodec, fsdp::Resharding) -----------------
  // Every parameter (full precision, all its names) and buffer, on the CPU.
  // Collective; with rank0_only, ranks other than 0 get an empty map.
  std::map<std::string, torch::Tensor> full_state_dict(bool rank0_only = true);
  // The loads below are local: each rank loads its shards (and buffers and
  // frozen parameters), and what stays gathered (the root unit) is stale
  // until shards_changed(), a collective, gathers it again. Call that on every
  // rank once every rank has loaded (FSDPStrategy agrees on it first: a rank
  // whose load failed would never join the gather).
  //   fsdp.load_full_state_dict(weights, /*strict=*/true, "w.ckpt");
  //   fsdp.shards_changed();
  // Loads full weights (each rank keeps its shard of them).
  LoadReport load_full_state_dict(const std::map<std::string, torch::Tensor>& weights, bool strict,
                                  const std::string& source);
  // This rank's shards, buffers and frozen parameters, plus layout() in values.
  State sharded_state_dict() const;
  // Loads a sharded_state_dict(); checks the layout first and says what differs.
  void load_sharded_state_dict(const State& state, const std::string& source);
  // World size, strategy and every unit's parameters and offsets: what must
  // match for a sharded checkpoint to load.
  nlohmann::json layout() const;
  // Resharding: a sharded checkpoint of the same model
  // and wrap policy written by another number of ranks per shard group.
  // saved[s] is the part ("model" or "optim_wrapper/optimizer") of the file
  // of saved shard rank s, opened, not read: each rank reads the elements
  // that overlap its own shards, and no other. Local (no collectives).
  //   This rank's sharded_state_dict() (load it with load_sharded_state_dict):
  State resharded_state_dict(const nlohmann::json& saved_layout, const std::vector<StateReader>& saved) const;
  //   This rank's state of `optimizer`, as the optimizer's own state() would be:
  State resharded_optimizer_state(const torch::optim::Optimizer& optimizer, const nlohmann::json& saved_layout,
                                  const std::vector<StateReader>& saved) const;
  // The state of `optimizer` (over shard_parameters(), one param group; or
  // over named_orig_parameters(), any groups), converted to the layout of an
  // optimizer over the model's own parameters as DDP or SingleDeviceStrategy
  // builds it: whole tensors, the model's order (paramwise_cfg's groups with
  // use_orig_params), values["param_names"] naming each position. Collective;
  // rank0_only as above. And back (local; the names are checked when given).
  State full_optimizer_state(const torch::optim::Optimizer& optimizer, const State& local, bool rank0_only = true);
  State shard_optimizer_state(const torch::optim::Optimizer& optimizer, const State& full) const;

  // --- this rank's elements of each parameter (DCP checkpoints, dcp_state_dict.h)
  struct LocalPart {
    std::string name;                  // the parameter's first name in the model
    std::vector<std::string> aliases;  // its further names (tied parameters)
    std::vector<int64_t> shape;        // the whole parameter's
    int64_t begin = 0;                 // this rank holds its flattened elements [begin, begin + values.numel())
    torch::Tensor values;              // a 1-D view of this rank's shard: writing it writes the parameter
    torch::Tensor leaf;                // what the optimizer steps for it (use_orig_params); undefined: frozen
    bool first_replica = true;         // false on HSDP's other replicas, which hold the same elements
  };
  // Every parameter in the units, in unit and slot order. Local.
  std::vector<LocalPart> local_parts() const;
  // What every rank holds whole: the buffers, and FSDP1's frozen parameters.
  // After writing into these or local_parts()' values (loading a
  // checkpoint), call shards_changed() on every rank.
  std::vector<std::pair<std::string, torch::Tensor>> whole_tensors() const;

  // --- introspection ------------------------------------------------------
  const std::vector<std::unique_ptr<fsdp::FlatParamUnit>>& units() const;
  const FSDPOptions& options() const;
  // The order units ran forward / began backward in the first iteration.
  const fsdp::ExecutionOrder& execution_order() const;
  FSDPMemoryStats memory_stats() const;
  void reset_peak_stats();

 private:
  // Declared in this order so that they are destroyed in the reverse one:
  // the runtime before the meter and the step check it refers to, and
  // everything before the model.
  std::unique_ptr<fsdp::ShardedModel> model_;
  std::unique_ptr<fsdp::StepCheck> step_check_;  // ranks ran the same step and units (Note [FSDP's step check])
  std::unique_ptr<fsdp::MemoryMeter> meter_;
  std::unique_ptr<fsdp::StepRuntime> runtime_;
  std::unique_ptr<fsdp::UnitBuilder> builder_;  // keeps the Sequential entries it replaced until FSDP goes
  std::unique_ptr<fsdp::StateDictCodec> codec_;
};

}  // namespace lockstep
