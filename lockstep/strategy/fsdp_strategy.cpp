#include "lockstep/strategy/fsdp_strategy.h"

#include <filesystem>

#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/checkpoint/sharded_checkpoint.h"
#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/model/model.h"
#include "lockstep/optim/optim_wrapper_builder.h"
#include "lockstep/optim/optimizer_builder.h"
#include "lockstep/checkpoint/dcp_state_dict.h"
#include "lockstep/parallel/fsdp/fully_shard_options.h"

namespace lockstep {

FSDPStrategyOptions parse_fsdp_strategy_options(const Config& config) {
  FSDPStrategyOptions options;
  options.distributed = parse_distributed_options(config);
  for (const char* key : {"state_dict_type", "state_dict_cfg"}) {
    if (!config.has(key)) continue;
    const std::string type = config.get<std::string>(key);
    if (type == "full") {
      options.state_dict_type = StateDictType::kFull;
    } else if (type == "sharded" || type == "local") {
      options.state_dict_type = StateDictType::kSharded;
    } else if (type == "dcp") {
      options.state_dict_type = StateDictType::kDcp;
    } else {
      LOCKSTEP_FAIL(config.where(key), ": ", key, " must be 'full', 'sharded' ('local') or 'dcp', got '", type, "'");
    }
  }
  Config wrapper = config.child("model_wrapper");
  if (!wrapper.is_null()) {
    const std::string type = wrapper.get<std::string>("type", "MMFullyShardedDataParallel");
    if (type == "FullyShard") {
      options.fsdp = parse_fully_shard_options(wrapper);
      // fully_shard's sharded state dicts are DTensors, which PyTorch saves with DCP.
      if (options.state_dict_type == StateDictType::kSharded) options.state_dict_type = StateDictType::kDcp;
    } else {
      LOCKSTEP_CHECK(type == "MMFullyShardedDataParallel" || type == "FullyShardedDataParallel", wrapper.where("type"),
                     ": FSDPStrategy wraps with MMFullyShardedDataParallel (or FullyShardedDataParallel), or with "
                     "FullyShard (FSDP2, PyTorch's fully_shard), got '", type, "'");
      options.fsdp = parse_fsdp_options(wrapper);
    }
    check_all_used(wrapper, "model_wrapper");
  }
  options.async_save = config.get<bool>("async_save", false);
  LOCKSTEP_CHECK(!options.async_save || options.state_dict_type == StateDictType::kDcp, config.where("async_save"),
                 ": async_save writes DCP checkpoints in the background; it needs state_dict_type: dcp");
  LOCKSTEP_CHECK(options.state_dict_type != StateDictType::kDcp || options.fsdp.use_orig_params(),
                 config.where("state_dict_type"), ": state_dict_type: dcp saves each parameter's optimizer state "
                 "under its name, so it needs model_wrapper.use_orig_params: true (or type: FullyShard)");
  return options;
}

FSDPStrategy::FSDPStrategy(FSDPStrategyOptions options)
    : DistributedStrategy(options.distributed), options_(std::move(options)) {}

std::shared_ptr<Model> FSDPStrategy::build_model(const Config& config) {
  // FullyShard's per-parameter shards are cut when it wraps: a model's
  // shard_when_built units stay whole while building (FSDP1's flat layout only).
  if (options_.fsdp.per_parameter_sharding()) return Strategy::build_model(config);
  fsdp::ShardWhileBuilding scope(FullyShardedDataParallel::shard_plan(options_.fsdp, world_, device_));
  return Strategy::build_model(config);
}

void FSDPStrategy::place_model(Model& model) {
  // FSDP sees a submodule's forward through torch::nn::Sequential or a unit
  // scope in C++ code; a scripted module's forward runs inside TorchScript,
  // where neither reaches. So it is one unit, the root (every sharding
  // strategy works; parameters are gathered for the whole forward).
  LOCKSTEP_CHECK(model.submodules_run_in_cpp() || !options_.fsdp.auto_wrap_policy(),
                 "FSDPStrategy: a TorchScriptModel is sharded as one FSDP unit: its submodules run inside "
                 "TorchScript, where FSDP cannot gather their parameters one by one; drop "
                 "model_wrapper.auto_wrap_policy");
  // The model stays where it was built (the host): FSDP moves it to the
  // device a unit at a time, so the device never holds the whole model.
  fsdp_ = std::make_shared<FullyShardedDataParallel>(model.shared_from_this(), world_,
                                                     FSDPOptions(options_.fsdp).device_id(device_));
  model.move_to(device_);  // what is left: the data preprocessor (parameters and buffers are there already)
  const auto& precision = options_.fsdp.mixed_precision();
  if (precision.param_dtype() && precision.cast_root_forward_inputs()) {
    model.data_preprocessor().set_input_dtype(precision.param_dtype());
  }
  model.set_output_dtype(precision.output_dtype());
}

std::shared_ptr<OptimWrapperBase> FSDPStrategy::build_optim_wrapper_for(const Config& config, Model& model) {
  LOCKSTEP_CHECK(config.is_map() && config.has("optimizer"), config.where(),
                 ": FSDPStrategy trains with one optimizer: optim_wrapper needs an 'optimizer' key (one wrapper per "
                 "network is not supported under FSDP)");
  const Config paramwise = config.child("paramwise_cfg");
  if (!options_.fsdp.use_orig_params()) {
    LOCKSTEP_CHECK(paramwise.is_null(), config.where("paramwise_cfg"),
                   ": paramwise_cfg under FSDPStrategy needs strategy.model_wrapper.use_orig_params: true (the "
                   "optimizer then steps each original parameter's part of the shards with its own options, as "
                   "PyTorch's use_orig_params; without it it steps one flat shard per unit)");
  }
  std::shared_ptr<OptimWrapper> wrapper;
  if (options_.fsdp.use_orig_params()) {
    // The same groups, in the same order, as DDP builds over the model itself.
    auto built = build_optimizer_with_groups(config.at("optimizer"), paramwise, fsdp_->named_orig_parameters(),
                                             param_owners(model));
    wrapper = wrap_optimizer(config, built.optimizer);
  } else {
    wrapper = wrap_optimizer(config, build_optimizer(config.at("optimizer"), Config(), fsdp_->named_shard_parameters()));
  }
  wrapper->set_gradient_sync(fsdp_);
  fsdp_->track_optimizer(wrapper->optimizer_ptr());
  return wrapper;
}

std::map<std::string, torch::Tensor> FSDPStrategy::model_state_dict() {
  LOCKSTEP_CHECK(fsdp_ != nullptr, name(), ": no model prepared");
  return fsdp_->full_state_dict(/*rank0_only=*/true);
}

// Note [Loading, then gathering]
// Loading into the shards is each rank's own work: reading its file (the
// whole checkpoint, its shard file, its part of a DCP directory), checking
// names and shapes, copying. Gathering again what stays gathered (the root
// unit, every unit under NO_SHARD) is a collective. A rank whose load failed
// never joins that gather, so the others would sit in it, and it in the
// agreement that would tell them, until the timeout. So every load agrees
// first that every rank loaded its part (every rank fails at once, naming the
// rank and its reason), and only then gathers (shards_changed). The loads
// below this point are local; load_into_shards is the one way in.
void FSDPStrategy::load_into_shards(const std::string& what, const std::function<void()>& load) {
  LOCKSTEP_CHECK(fsdp_ != nullptr, name(), ": no model prepared");
  collectives_->agree(what, load);
  fsdp_->shards_changed();
}

LoadReport FSDPStrategy::load_model_state_dict(const std::map<std::string, torch::Tensor>& weights, bool strict,
                                               const std::string& source) {
  LoadReport report;
  load_into_shards(str_cat("loading the model weights of ", source, " into each rank's shards"),
                   [&] { report = load_full_weights(weights, strict, source); });
  return report;
}

LoadReport FSDPStrategy::load_full_weights(const std::map<std::string, torch::Tensor>& weights, bool strict,
                                           const std::string& source) {
  LoadReport report = fsdp_->load_full_state_dict(without_module_prefix(weights), strict, source);
  if (!report.clean() && collectives_->is_main_process()) logger().warn("{}", report.describe(source));
  return report;
}

void FSDPStrategy::save_checkpoint(const std::string& path, CheckpointContents contents,
                                   const CheckpointOptions& options) {
  LOCKSTEP_CHECK(fsdp_ != nullptr, name(), ": no model prepared");
  const bool with_optimizer = optim_wrapper_ && options.save_optimizer();
  if (options_.state_dict_type == StateDictType::kFull) {
    fill_checkpoint(contents, CheckpointOptions(options).save_optimizer(false));  // the model, gathered unit by unit
    if (with_optimizer) {
      State wrapper_state = single_wrapper().state();
      State full = fsdp_->full_optimizer_state(single_wrapper().optimizer(), wrapper_state.get("optimizer"),
                                               /*rank0_only=*/true);
      contents.optim_wrapper = optim_state_with(std::move(wrapper_state), std::move(full));
    }
    collectives_->agree("saving checkpoint " + path, [&] {
      if (collectives_->is_main_process()) write_checkpoint(path, contents);
    });
    return;
  }
  if (options_.state_dict_type == StateDictType::kDcp) {
    save_dcp_checkpoint(path, std::move(contents), options);
    return;
  }
  CheckpointShard shard;
  shard.rank = collectives_->rank();
  shard.world_size = collectives_->world_size();
  shard.model = fsdp_->sharded_state_dict();
  if (with_optimizer) shard.optim_wrapper = single_wrapper().state();
  // Every rank writes its shard; all learn whether every shard is on disk.
  collectives_->agree(str_cat("saving checkpoint ", path, ": writing the shard of each rank"),
                      [&] { write_shard(path, shard); });
  fill_scheduler_states(contents, options);
  contents.sharding = nlohmann::json{{"world_size", collectives_->world_size()}, {"with_optimizer", with_optimizer},
                                     {"layout", fsdp_->layout()}};
  // The manifest appears only once every shard is on disk (the agreement above).
  collectives_->agree("saving checkpoint " + path + ": writing its manifest", [&] {
    if (collectives_->is_main_process()) write_checkpoint(path, contents);
  });
}

CheckpointContents FSDPStrategy::load_checkpoint(const std::string& path, bool load_optimizer, bool load_schedulers,
                                                 bool strict) {
  CheckpointContents contents;
  load_into_shards(str_cat("loading ", path, " into each rank's shards"), [&] {
    contents = Strategy::load_checkpoint(path, load_optimizer, load_schedulers, strict);
  });
  return contents;
}

CheckpointContents FSDPStrategy::load_checkpoint_contents(const std::string& path, CheckpointContents contents,
                                                          bool load_optimizer, bool load_schedulers, bool strict) {
  if (contents.sharded()) {
    const int saved_world = contents.sharding->value("world_size", -1);
    const nlohmann::json saved_layout = contents.sharding->value("layout", nlohmann::json::object());
    if (saved_world != collectives_->world_size() || saved_layout.value("shard_world_size", -1) != fsdp_->layout().at("shard_world_size")) {
      load_resharded(path, contents, load_optimizer);
      load_optim_and_schedulers(contents, /*load_optimizer=*/false, load_schedulers, path);
      return contents;
    }
    CheckpointShard shard = read_shard(path, collectives_->rank(), collectives_->world_size());
    const std::string shard_file = shard_path(path, collectives_->rank(), collectives_->world_size());
    fsdp_->load_sharded_state_dict(shard.model, shard_file);
    if (load_optimizer && optim_wrapper_) {
      LOCKSTEP_CHECK(shard.optim_wrapper.has_value(), shard_file,
                     ": holds no optimizer state (saved with save_optimizer: false?)");
      check_same_optimizer_layout(saved_layout, path);
      try {
        single_wrapper().load_state(*shard.optim_wrapper);
      } catch (...) {
        rethrow_with_context(shard_file + ": loading the optimizer state");
      }
    }
    load_optim_and_schedulers(contents, /*load_optimizer=*/false, load_schedulers, path);
    return contents;
  }
  load_full_weights(model_weights(contents, path), strict, path);
  if (load_optimizer && optim_wrapper_) {
    LOCKSTEP_CHECK(contents.optim_wrapper.has_value(), path,
                   ": holds no optimizer state (saved with save_optimizer: false?)");
    State sharded_optimizer;
    try {
      sharded_optimizer =
          fsdp_->shard_optimizer_state(single_wrapper().optimizer(), contents.optim_wrapper->get("optimizer"));
    } catch (...) {
      rethrow_with_context(path + ": sharding the optimizer state");
    }
    CheckpointContents converted = contents;
    converted.optim_wrapper = optim_state_with(*contents.optim_wrapper, std::move(sharded_optimizer));
    load_optim_and_schedulers(converted, /*load_optimizer=*/true, load_schedulers, path);
  } else {
    load_optim_and_schedulers(contents, /*load_optimizer=*/false, load_schedulers, path);
  }
  return contents;
}

void FSDPStrategy::check_same_optimizer_layout(const nlohmann::json& saved_layout, const std::string& path) const {
  const bool saved_orig = saved_layout.value("use_orig_params", false);
  LOCKSTEP_CHECK(saved_orig == options_.fsdp.use_orig_params(), path,
                 ": the sharded optimizer state was saved with use_orig_params: ", saved_orig ? "true" : "false",
                 " and this run has ", saved_orig ? "false" : "true",
                 "; resume with the same setting, or save with state_dict_type: full to change it");
}

void FSDPStrategy::load_resharded(const std::string& path, const CheckpointContents& contents, bool load_optimizer) {
  ShardedCheckpoint saved(path, *contents.sharding);
  try {
    fsdp_->load_sharded_state_dict(fsdp_->resharded_state_dict(saved.layout(), saved.model_parts()), path);
  } catch (...) {
    rethrow_with_context(str_cat(path, ": resharding the model from ", saved.world_size(), " to ", collectives_->world_size(), " ranks"));
  }
  if (load_optimizer && optim_wrapper_) {
    LOCKSTEP_CHECK(saved.with_optimizer(), path, ": holds no optimizer state (saved with save_optimizer: false?)");
    check_same_optimizer_layout(saved.layout(), path);
    try {
      std::vector<StateReader> wrappers = saved.optim_wrapper_parts();
      std::vector<StateReader> optimizers;
      for (const auto& wrapper : wrappers) optimizers.push_back(wrapper.part("optimizer"));
      // Everything of the wrapper but its optimizer is the same on every rank.
      State rest;
      rest.values = wrappers.front().values();
      for (const auto& key : wrappers.front().keys()) {
        if (key.rfind("optimizer/", 0) != 0) rest.tensors[key] = wrappers.front().read(key);
      }
      State optimizer = fsdp_->resharded_optimizer_state(single_wrapper().optimizer(), saved.layout(), optimizers);
      single_wrapper().load_state(optim_state_with(std::move(rest), std::move(optimizer)));
    } catch (...) {
      rethrow_with_context(str_cat(path, ": resharding the optimizer state from ", saved.world_size(), " to ",
                                   collectives_->world_size(), " ranks"));
    }
  }
  logger().info("rank {}: resharded {} (written by {} rank(s), {} per shard group) to {} ranks: read {} of the {} "
                "tensor bytes in {} of its {} shard files",
                collectives_->rank(), path, saved.world_size(), saved.shard_world_size(), collectives_->world_size(), saved.bytes_read(),
                saved.bytes_in_opened_files(), saved.opened_files(), saved.world_size());
}

void FSDPStrategy::load_sharded_weights(const std::string& path, bool strict) {
  load_checkpoint(path, /*load_optimizer=*/false, /*load_schedulers=*/false, strict);
}

LOCKSTEP_REGISTER(strategy_registry(), "FSDPStrategy", [](const Config& config) {
  return std::make_shared<FSDPStrategy>(parse_fsdp_strategy_options(config));
});

std::string FSDPStrategy::cuda_graph_obstacle() const {
  std::string obstacle = Strategy::cuda_graph_obstacle();
  if (!obstacle.empty()) return obstacle;
  if (options_.fsdp.offload_params()) {
    return "FSDP with cpu_offload: the optimizer steps on the shards in host memory, which a CUDA graph cannot hold";
  }
  return "FSDPStrategy's step is not captured yet: its units gather and free their parameters by host code a "
         "replay would skip (train with SingleDeviceStrategy, or without cuda_graph)";
}

// Note [DCP checkpoints of lockstep train]
// state_dict_type: dcp writes what PyTorch's own FSDP2 users write, a DCP
// directory of the model and optimizer (dcp_state_dict.h), beside a lockstep
// manifest at `path` that holds the rest (trainer, data loader, schedulers,
// the optimizer wrapper's own state, the meta) and names the directory. The
// order keeps a checkpoint whole or absent: rank 0 removes an old manifest
// of the same name before anything is rewritten; every rank writes its file;
// rank 0 writes `.metadata` once all are on disk (what makes the directory a
// checkpoint for dcp.load) and the manifest last (what makes it one for
// lockstep's resume, and what last_checkpoint may then point at). A process
// killed in between leaves the earlier checkpoints as they were.
FSDPStrategy::StagedDcpSave FSDPStrategy::stage_dcp_save(const std::string& path, CheckpointContents contents,
                                                          const CheckpointOptions& options, bool copy) {
  const bool with_optimizer = optim_wrapper_ && options.save_optimizer();
  const bool main = collectives_->is_main_process();
  StagedDcpSave staged;
  staged.path = path;
  staged.dir = dcp_directory(path);
  collectives_->agree(str_cat("saving checkpoint ", path, ": making ", staged.dir), [&] {
    if (main) prepare_dcp_directory(path, staged.dir);
  });
  staged.part = fsdp_dcp_part(*fsdp_, with_optimizer ? &single_wrapper().optimizer() : nullptr, main);
  fill_scheduler_states(contents, options);
  // The wrapper's own state (accumulation, loss scale); its optimizer's is in the directory.
  if (with_optimizer) contents.optim_wrapper = optim_state_with(single_wrapper().state(), State());
  contents.sharding = nlohmann::json{{"format", "dcp"},
                                     {"directory", std::filesystem::path(staged.dir).filename().string()},
                                     {"world_size", collectives_->world_size()},
                                     {"with_optimizer", with_optimizer}};
  staged.contents = std::move(contents);
  if (copy) {  // training goes on: the staged state must not change under the writer
    for (DcpTensorPart& box : staged.part.tensors) box.values = box.values.to(torch::kCPU, false, /*copy=*/true);
    auto own = [](State& state) {
      for (auto& entry : state.tensors) entry.second = entry.second.detach().to(torch::kCPU, false, /*copy=*/true);
    };
    if (staged.contents.optim_wrapper) own(*staged.contents.optim_wrapper);
    if (staged.contents.trainer) own(*staged.contents.trainer);
    for (auto& entry : staged.contents.param_schedulers) {
      for (State& state : entry.second) own(state);
    }
  }
  return staged;
}

void FSDPStrategy::save_dcp_checkpoint(const std::string& path, CheckpointContents contents,
                                       const CheckpointOptions& options) {
  const StagedDcpSave staged = stage_dcp_save(path, std::move(contents), options, /*copy=*/false);
  nlohmann::json records;
  collectives_->agree(str_cat("saving checkpoint ", path, ": writing the DCP file of each rank"), [&] {
    records = write_dcp_rank_file(staged.dir, collectives_->rank(), staged.part);
  });
  const std::vector<nlohmann::json> all_records = collectives_->all_gather_json(records);
  collectives_->agree(str_cat("saving checkpoint ", path, ": writing ", staged.dir, "/.metadata and the manifest"), [&] {
    if (!collectives_->is_main_process()) return;
    write_dcp_metadata(staged.dir, all_records);
    write_checkpoint(path, staged.contents);
  });
}

// Note [Saving in the background]
// With async_save, a save stages everything on the main thread, in the
// step's place: the agreement that makes the directory, this rank's
// elements copied to the host, the manifest's contents. Then training goes
// on while a thread of its own writes this rank's file, gathers every rank's
// records (or errors) over a side channel of the world group (its own
// connections' tags, usable from another thread, so it never pairs with a
// training collective), and on rank 0 writes .metadata, the manifest and
// then last_checkpoint (Note [DCP checkpoints of lockstep train] for why that
// order keeps a checkpoint whole or absent). At most one save is in flight:
// the next one, and the end of the run, wait for it in an agreement, so a
// save that failed on any rank fails every rank there. The checkpoints it
// replaces (max_keep_ckpts) are removed only once it is whole, so a process
// killed while it writes resumes from the one before.
void FSDPStrategy::save_checkpoint_then(const std::string& path, CheckpointContents contents,
                                        const CheckpointOptions& options, std::function<void()> committed) {
  if (!options_.async_save) return Strategy::save_checkpoint_then(path, std::move(contents), options, std::move(committed));
  LOCKSTEP_CHECK(fsdp_ != nullptr, name(), ": no model prepared");
  finish_checkpoint_saves();
  if (!checkpoint_channel_) checkpoint_channel_ = world_->side_channel("checkpoint");
  auto staged = std::make_shared<StagedDcpSave>(stage_dcp_save(path, std::move(contents), options, /*copy=*/true));
  const int rank = collectives_->rank();
  const bool main = collectives_->is_main_process();
  saver_.start([staged, rank, main, channel = checkpoint_channel_, committed = std::move(committed)] {
    nlohmann::json mine{{"error", ""}};
    try {
      mine["records"] = write_dcp_rank_file(staged->dir, rank, staged->part);
    } catch (...) {
      mine["error"] = describe_exception(std::current_exception());
    }
    const std::vector<nlohmann::json> all = all_gather_object(mine, channel);
    std::vector<nlohmann::json> records;
    for (size_t r = 0; r < all.size(); ++r) {
      const std::string error = all[r].value("error", std::string());
      LOCKSTEP_CHECK(error.empty(), "saving checkpoint ", staged->path, " in the background: rank ", r, ": ", error);
      records.push_back(all[r].at("records"));
    }
    if (!main) return;
    write_dcp_metadata(staged->dir, records);
    write_checkpoint(staged->path, staged->contents);
    committed();
  });
}

void FSDPStrategy::after_checkpoint_saves(std::function<void()> action) {
  if (collectives_->is_main_process()) saver_.after(std::move(action));
}

void FSDPStrategy::finish_checkpoint_saves() {
  collectives_->agree("finishing the checkpoint save in the background", [&] { saver_.wait(); });
}

int64_t FSDPStrategy::read_dcp(const std::string& dir, bool optimizer, const std::string& what) {
  try {
    return load_fsdp_dcp(*fsdp_, DcpReader(dir), optimizer ? &single_wrapper().optimizer() : nullptr);
  } catch (...) {
    rethrow_with_context(what);
  }
}

}  // namespace lockstep
