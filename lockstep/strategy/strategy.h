// Strategy: how one model is placed on devices and processes.
//
// A strategy owns the model once prepared (moved to its device, wrapped by
// DDP or FSDP when distributed), its optim wrapper and its parameter
// schedulers, and it knows how to save and load them: a single device saves
// everything it holds, DDP saves on rank 0 and loads everywhere, FSDP gathers
// or shards. mmengine's BaseStrategy semantics.
//
//   auto strategy = lockstep::build_strategy(cfg.child("strategy"));
//   strategy->prepare(model, cfg.at("optim_wrapper"), cfg.child("param_scheduler"),
//                     lockstep::SchedulerContext{iters_per_epoch, max_iters});
//   lockstep::CheckpointContents extra;  // the strategy fills in model, optimizer, schedulers
//   extra.trainer = trainer.state();
//   strategy->save_checkpoint("work_dirs/run/model_final.ckpt", extra, lockstep::CheckpointOptions());
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/config/registry.h"
#include "lockstep/core/load_report.h"
#include "lockstep/core/state.h"
#include "lockstep/optim/optim_wrapper.h"
#include "lockstep/optim/param_scheduler.h"
#include "lockstep/strategy/collectives.h"

namespace lockstep {

class Model;

struct CheckpointOptions {
  TORCH_ARG(bool, save_optimizer) = true;
  TORCH_ARG(bool, save_param_scheduler) = true;
};

// Schedulers of each optim wrapper, by wrapper name ("" for a single wrapper).
using SchedulerMap = std::map<std::string, std::vector<std::shared_ptr<ParamScheduler>>>;

class Strategy {
 public:
  virtual ~Strategy();

  // Places (and for parallel strategies wraps) the model, then builds the
  // optim wrapper from `optim_wrapper_config` and the schedulers from
  // `scheduler_config` (a list, or a map of lists by optim wrapper name).
  void prepare(std::shared_ptr<Model> model, const Config& optim_wrapper_config,
               const Config& scheduler_config, const SchedulerContext& context);
  // Builds the model `config` describes (lockstep::build_model) for this
  // strategy: FSDPStrategy shards the units that opt in while they are built
  // (parallel/fsdp/shard_while_building.h). The runner builds through it.
  virtual std::shared_ptr<Model> build_model(const Config& config);

  std::shared_ptr<Model> model() const { return model_; }
  std::shared_ptr<OptimWrapperBase> optim_wrapper() const { return optim_wrapper_; }
  const SchedulerMap& schedulers() const { return schedulers_; }
  // Every optim wrapper's schedulers where an uninterrupted run would have them
  // after `iteration` iterations (lockstep::replay_schedulers). A checkpoint
  // written by another world size counts its scheduler steps in iterations of
  // another length, so loading one skips the schedulers' states and the runner
  // replays them to the position it resumes at instead.
  void replay_schedulers(int64_t iteration);

  // The collectives over the run's processes (collectives.h): a world of one
  // process unless the strategy is distributed. They are where code above
  // the strategy asks for this rank and the world size
  // (`collectives()->rank()`); code below it asks get_rank() (comm/comm.h).
  // Both read the world group.
  const std::shared_ptr<Collectives>& collectives() const { return collectives_; }
  torch::Device device() const { return device_; }
  virtual std::string name() const = 0;
  // Why this strategy's training step cannot be captured as one CUDA graph
  // (`cuda_graph`, engine/cuda_graph_step.h), or "" if it can. Asked before
  // training; the base says the CPU cannot.
  virtual std::string cuda_graph_obstacle() const;
  // Averaged copies of the weights (EMAHook): which tensors this rank's
  // optimizer steps, how an average of them becomes checkpoint state and
  // back, and what to do after the average was swapped into them. Null
  // members mean the plain case: the model's own parameters, saved as they
  // are. FSDP averages its rank's shards and saves through its full state
  // dict (strategy/fsdp_weight_averaging.cpp).
  struct WeightAveraging {
    std::function<std::map<std::string, torch::Tensor>()> stepped_parameters;
    std::function<State(const std::map<std::string, torch::Tensor>& average)> save;
    std::function<void(const State& state, std::map<std::string, torch::Tensor>& average)> load;
    std::function<void()> after_swap;
  };
  virtual WeightAveraging weight_averaging() { return {}; }

  // The full model state (parameters and buffers) as CPU tensors by name.
  virtual std::map<std::string, torch::Tensor> model_state_dict();
  // Loads weights by name ("module." prefixes are stripped); strict turns any
  // missing, unexpected or mis-shaped key into an error that lists them.
  virtual LoadReport load_model_state_dict(const std::map<std::string, torch::Tensor>& weights, bool strict,
                                           const std::string& source);

  // Adds the model, optimizer and schedulers to `contents` (which holds the
  // trainer state and meta) and writes the checkpoint (checkpoint_layout.h).
  virtual void save_checkpoint(const std::string& path, CheckpointContents contents, const CheckpointOptions& options);
  // save_checkpoint, then `committed` on rank 0 once the checkpoint is whole
  // on disk: here before it returns; under FSDPStrategy's async_save later,
  // on its saving thread, while training goes on. Collective.
  virtual void save_checkpoint_then(const std::string& path, CheckpointContents contents,
                                    const CheckpointOptions& options, std::function<void()> committed);
  // Runs `action` on rank 0 once no save is in flight (here: at once).
  virtual void after_checkpoint_saves(std::function<void()> action);
  // Waits for a save in flight; every rank fails if it failed on any. Collective.
  virtual void finish_checkpoint_saves() {}
  // Reads a checkpoint, loads the model (and optimizer/schedulers when asked)
  // and returns the whole contents so the caller can read trainer and meta:
  // a DCP checkpoint (lockstep's manifest, or PyTorch's directory) through
  // read_dcp, a lockstep checkpoint file through load_checkpoint_contents.
  virtual CheckpointContents load_checkpoint(const std::string& path, bool load_optimizer, bool load_schedulers,
                                             bool strict = true);
  // Loads the model weights of a sharded checkpoint (load_from of one):
  // only FSDPStrategy, which wrote it, can; others refuse, saying what to do.
  virtual void load_sharded_weights(const std::string& path, bool strict);

 protected:
  // Subclasses decide placement and wrapping.
  virtual void place_model(Model& model) = 0;
  // Builds an optim wrapper for `model`, the model placed. DDP attaches its
  // GradientSync to the one the base builds; FSDP builds one over its shards.
  virtual std::shared_ptr<OptimWrapperBase> build_optim_wrapper_for(const Config& config, Model& model);
  // The model, optimizer and schedulers into `contents`, as options say.
  void fill_checkpoint(CheckpointContents& contents, const CheckpointOptions& options);
  // Only the schedulers' states (a sharded checkpoint's manifest).
  void fill_scheduler_states(CheckpointContents& contents, const CheckpointOptions& options) const;
  void load_optim_and_schedulers(const CheckpointContents& contents, bool load_optimizer, bool load_schedulers,
                                 const std::string& path);
  // The one optim wrapper (FSDP shards one optimizer; a DCP checkpoint holds
  // one); an error naming the strategy otherwise.
  OptimWrapper& single_wrapper() const;
  // The wrapper's state with its optimizer part replaced (the layout of one
  // optimizer over the model's own parameters, or over this rank's shards).
  static State optim_state_with(State wrapper_state, State optimizer_state);
  // DCP checkpoints (strategy_dcp.cpp): lockstep's manifest of one
  // (state_dict_type: dcp), and a directory PyTorch wrote (Note [Resuming
  // from PyTorch's DCP]).
  CheckpointContents load_dcp_checkpoint(const std::string& path, CheckpointContents contents, bool load_optimizer,
                                         bool load_schedulers);
  CheckpointContents load_foreign_dcp(const std::string& path, bool load_optimizer);
  // Loads what a lockstep checkpoint file holds (read into `contents`, not
  // DCP) into the model, and the optimizer and schedulers as asked.
  virtual CheckpointContents load_checkpoint_contents(const std::string& path, CheckpointContents contents,
                                                      bool load_optimizer, bool load_schedulers, bool strict);
  // Loads this rank's part of the DCP directory `dir` (here the whole model;
  // FSDPStrategy: its shards) and, with `optimizer`, the optimizer's state;
  // returns the optimizer's step count. Local; an error names `what`.
  virtual int64_t read_dcp(const std::string& dir, bool optimizer, const std::string& what);

  torch::Device device_ = torch::kCPU;
  std::shared_ptr<Collectives> collectives_ = std::make_shared<Collectives>();
  std::shared_ptr<Model> model_;
  std::shared_ptr<OptimWrapperBase> optim_wrapper_;
  SchedulerMap schedulers_;
};

// Everything on one device in one process.
class SingleDeviceStrategy : public Strategy {
 public:
  explicit SingleDeviceStrategy(torch::Device device = torch::kCPU);
  std::string name() const override { return "SingleDeviceStrategy"; }

 protected:
  void place_model(Model& model) override;
};

Registry<Strategy>& strategy_registry();
// Builds `strategy:` (null: SingleDeviceStrategy with device auto: the first
// GPU when one is visible, else the CPU; see device_choice.h).
std::shared_ptr<Strategy> build_strategy(const Config& config);

// `weights` with the "module." prefix that a model wrapped in Python's DDP
// (or saved from one) puts on every name taken off, as load_model_state_dict
// does in every strategy.
std::map<std::string, torch::Tensor> without_module_prefix(const std::map<std::string, torch::Tensor>& weights);

}  // namespace lockstep
