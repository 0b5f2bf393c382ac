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
//     See Note [The root unit] in fsdp_setup.cpp.
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
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lockstep/core/load_report.h"
#include "lockstep/core/state.h"
#include "lockstep/core/state_reader.h"
#include "lockstep/optim/gradient_sync.h"
#include "lockstep/parallel/fsdp/flat_param.h"
#include "lockstep/parallel/fsdp/fsdp_options.h"
#include "lockstep/parallel/fsdp/shard_while_building.h"
#include "lockstep/parallel/fsdp/unit_scope.h"

namespace lockstep {

class ProcessGroup;

// Bytes held by parameters, gradients and optimizer state on this rank,
// tracked at every gather, free and reduction FSDP performs.
struct FSDPMemoryStats {
  int64_t params = 0;      // shards + gathered buffers + unsharded parameters (frozen ones too)
  int64_t grads = 0;       // parameters' own gradients + flat buffers in flight + sharded gradients
  int64_t optimizer = 0;   // optimizer state of the tracked optimizer (measured after each step)
  int64_t peak_params = 0;
  int64_t peak_grads = 0;
  int64_t peak_optimizer = 0;
  int64_t peak_total = 0;  // the largest params + grads + optimizer seen at once
};

class FullyShardedDataParallel : public GradientSync, private fsdp::detail::UnitRuntime {
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
    FullParams(const FullParams&) = delete;
    FullParams& operator=(const FullParams&) = delete;

   private:
    friend class FullyShardedDataParallel;
    FullParams(FullyShardedDataParallel* fsdp, bool writeback);
    FullyShardedDataParallel* fsdp_;
    bool writeback_;
    std::vector<torch::Tensor> flats_;  // by unit
  };
  [[nodiscard]] std::unique_ptr<FullParams> summon_full_params(bool writeback = false);

  // --- state dicts (fsdp_state_dict.cpp) ----------------------------------
  // Every parameter (full precision, all its names) and buffer, on the CPU.
  // Collective; with rank0_only, ranks other than 0 get an empty map.
  std::map<std::string, torch::Tensor> full_state_dict(bool rank0_only = true);
  // Loads full weights on every rank (each keeps its shard). Local, then a
  // collective refresh of what is gathered; call it on every rank.
  LoadReport load_full_state_dict(const std::map<std::string, torch::Tensor>& weights, bool strict,
                                  const std::string& source);
  // This rank's shards, buffers and frozen parameters, plus layout() in values.
  State sharded_state_dict() const;
  // Loads a sharded_state_dict(); checks the layout first and says what differs.
  void load_sharded_state_dict(const State& state, const std::string& source);
  // World size, strategy and every unit's parameters and offsets: what must
  // match for a sharded checkpoint to load.
  nlohmann::json layout() const;
  // Resharding (fsdp_reshard.cpp): a sharded checkpoint of the same model
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

  // --- introspection ------------------------------------------------------
  const std::vector<std::unique_ptr<fsdp::FlatParamUnit>>& units() const { return units_; }
  const FSDPOptions& options() const { return options_; }
  torch::nn::Module& module() const { return *module_; }
  ProcessGroup* shard_group() const { return shard_group_.get(); }
  // The order units ran forward / began backward in the first iteration.
  const std::vector<int>& forward_order() const { return forward_order_; }
  const std::vector<int>& backward_order() const { return backward_order_; }
  // The most units gathered at once since the last reset (units that are
  // never freed -- the root, NO_SHARD, shard groups of one -- excluded).
  int max_gathered_units() const { return max_gathered_; }
  FSDPMemoryStats memory_stats() const { return memory_; }
  void reset_peak_stats();

 private:
  // Each private method's home, by concern: construction in fsdp_setup.cpp,
  // the step in fully_sharded_data_parallel.cpp, state dicts and optimizer
  // state in fsdp_state_dict.cpp, resharding in fsdp_reshard.cpp.

  // --- construction (fsdp_setup.cpp) ---------------------------------------
  static int hybrid_shard_group_size(const FSDPOptions& options, const ProcessGroup& group);
  void add_prebuilt_units(std::vector<std::string>& unit_paths) const;
  torch::Tensor checked_prebuilt_shard(const std::string& path, const std::vector<fsdp::FlatSlot>& slots,
                                       const fsdp::PrebuiltShard& cut) const;
  void build_units(const std::vector<std::string>& unit_paths);
  void intercept_sequential_entries();
  void restore_sequential_entries();
  void verify_same_model_on_every_rank();
  void move_unsharded_to(const torch::Device& device);
  void sync_module_states();
  void install_gradient_hooks(fsdp::FlatParamUnit& unit);
  void check_interception() const;

  // --- the step: forward (fully_sharded_data_parallel.cpp) ------------------
  // UnitRuntime
  void enter_unit(int unit) override;
  void leave_unit(int unit) noexcept override;
  void register_output(int unit, const torch::Tensor& output) override;
  void ensure_gathered(fsdp::FlatParamUnit& unit);
  void prefetch(int unit);
  int gathered_units() const;
  int next_in_forward(int unit) const;
  int next_in_backward(int unit) const;
  void refresh_persistent_units();
  void throw_pending_error();

  // --- the step: backward (fully_sharded_data_parallel.cpp) -----------------
  void pre_backward(int unit);
  void on_grad_ready(int unit, size_t slot);
  void post_backward(int unit);
  void begin_backward_pass();
  void finish_backward_pass();
  void finish_oldest_reduction();
  void sample_memory();

  // --- state dicts and optimizer state (fsdp_state_dict.cpp) ---------------
  // An error naming `source` and the first difference if a checkpoint of
  // `saved` (a layout()) does not fit this model's units.
  void check_units_fit(const nlohmann::json& saved, const std::string& source, bool same_shard_world) const;
  // Optimizer state conversions, for flat shards and for original parameters.
  State full_flat_optimizer_state(const State& sharded, bool rank0_only);
  State shard_flat_optimizer_state(const State& full) const;
  State full_orig_optimizer_state(const torch::optim::Optimizer& optimizer, const State& local, bool rank0_only);
  State shard_orig_optimizer_state(const torch::optim::Optimizer& optimizer, const State& full) const;
  struct SlotRef {
    const fsdp::FlatParamUnit* unit;
    size_t slot;
  };
  // The slot each position "<group>.<index>" of `optimizer` steps (use_orig_params).
  std::map<std::string, SlotRef> orig_positions(const torch::optim::Optimizer& optimizer) const;
  // position -> parameter name: of the unwrapped model's one group ("0.<i>", model order), or of `positions`.
  nlohmann::json flat_position_names() const;
  static nlohmann::json orig_position_names(const std::map<std::string, SlotRef>& positions);

  struct UnitRun {
    bool entered_ever = false;      // intercepted at least once
    int depth = 0;                  // open scopes
    bool output_registered = false; // in the current forward
    bool pre_backward_done = false;
    bool post_backward_done = false;
    int expected_grads = 0;
    int ready_grads = 0;
    std::vector<char> slot_ready;
    std::vector<char> slot_in_graph;
  };

  std::shared_ptr<torch::nn::Module> module_;
  FSDPOptions options_;
  std::shared_ptr<ProcessGroup> group_;            // this FSDP's own copy of the given group
  std::shared_ptr<ProcessGroup> shard_group_;      // null: no sharding (NO_SHARD)
  std::shared_ptr<ProcessGroup> replicate_group_;  // null: no replication
  std::vector<std::unique_ptr<fsdp::FlatParamUnit>> units_;
  std::vector<UnitRun> runs_;
  std::vector<std::pair<std::string, torch::Tensor>> frozen_;  // parameters without gradients
  std::vector<std::pair<std::string, torch::Tensor>> buffers_;
  std::map<std::string, torch::Dtype> buffer_dtypes_;  // before buffer_dtype cast them; state dicts use these
  int64_t trainable_count_ = 0;                     // unique trainable parameters of the model
  int prebuilt_units_ = 0;                          // units cut while the model was built
  struct SequentialEntry;
  std::vector<std::unique_ptr<SequentialEntry>> sequential_entries_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<fsdp::StepCheck> step_check_;  // ranks ran the same step and units (Note [FSDP's step check])
  int64_t iteration_ = 0;                         // of the current backward, for the step check

  // Where FSDP is in a step's backward. Every transition goes through
  // enter(), which asserts it is an edge of this machine:
  //   kIdle --begin_backward--> kPlanned --first hook--> kBackward
  //   kIdle --first hook (no begin_backward)--> kUnplannedBackward
  //   kPlanned --begin_backward--> kPlanned (a planned loss whose backward never ran)
  //   kBackward | kUnplannedBackward --begin_backward--> kBackward (hooks fired before the plan)
  //   any --finish_backward_pass / end_backward--> kIdle (reset_backward_state)
  enum class Phase {
    kIdle,
    kPlanned,            // begin_backward computed which slots this loss reaches
    kBackward,           // hooks are firing; units complete when their reached slots are ready
    kUnplannedBackward,  // hooks are firing for a backward begin_backward never saw: every slot counts
  };
  bool in_backward() const { return phase_ == Phase::kBackward || phase_ == Phase::kUnplannedBackward; }
  // Moves to `next`, asserting the diagram above has that edge.
  void enter(Phase next);
  // Clears every unit's per-backward progress and returns to kIdle: the one reset.
  void reset_backward_state();

  Phase phase_ = Phase::kIdle;
  bool sync_ = true;
  bool backward_seen_ = false;      // the first backward has finished: orders are fixed
  std::string pending_error_;
  std::string broken_;  // set by step_failed: why no step can run any more
  std::vector<int> forward_order_;
  std::vector<int> backward_order_;
  std::vector<int> reducing_;       // units with a reduction in flight, oldest first
  int max_gathered_ = 0;
  FSDPMemoryStats memory_;
  // (optimizer, its state().size()) when memory_.optimizer was counted (after_step).
  std::pair<const void*, size_t> optimizer_counted_{nullptr, 0};
};

}  // namespace lockstep
