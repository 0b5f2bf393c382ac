// Strategy's reading of DCP checkpoints (PyTorch's torch.distributed.checkpoint
// format): lockstep's own (state_dict_type: dcp, a manifest beside its
// directory) and directories PyTorch wrote. The base reads the whole model on
// every rank (DDP, one device); FSDPStrategy reads each rank's shards.
#include <utility>

#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/checkpoint/dcp_state_dict.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/model/model.h"  // IWYU pragma: keep (a Model is a torch::nn::Module: load_whole_model_dcp reads it)
#include "lockstep/optim/optim_wrapper.h"
#include "lockstep/optim/optimizer_state.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {

OptimWrapper& Strategy::single_wrapper() const {
  LOCKSTEP_CHECK(optim_wrapper_ != nullptr, name(), ": no optim wrapper built");
  auto wrappers = optim_wrapper_->wrappers();
  LOCKSTEP_CHECK(wrappers.size() == 1, name(), " needs one optim wrapper here (FSDP shards one optimizer, a DCP "
                 "checkpoint holds one), the model has ", wrappers.size());
  return *wrappers.front().second;
}

State Strategy::optim_state_with(State wrapper_state, State optimizer_state) {
  State result;
  for (auto& [key, tensor] : wrapper_state.tensors) {
    if (key.rfind("optimizer/", 0) != 0) result.tensors[key] = tensor;
  }
  result.values = wrapper_state.values;
  result.put("optimizer", std::move(optimizer_state));
  return result;
}

int64_t Strategy::read_dcp(const std::string& dir, bool optimizer, const std::string& what) {
  LOCKSTEP_CHECK(model_ != nullptr, name(), ": no model prepared");
  try {
    return load_whole_model_dcp(*model_, DcpReader(dir), optimizer ? &single_wrapper().optimizer() : nullptr);
  } catch (...) {
    rethrow_with_context(what);
  }
}

CheckpointContents Strategy::load_dcp_checkpoint(const std::string& path, CheckpointContents contents,
                                                 bool load_optimizer, bool load_schedulers) {
  const std::string dir = dcp_directory_of(path, contents);
  const bool optimizer = load_optimizer && optim_wrapper_;
  LOCKSTEP_CHECK(!optimizer || contents.sharding->value("with_optimizer", false), path,
                 ": holds no optimizer state (saved with save_optimizer: false?)");
  read_dcp(dir, optimizer, str_cat(path, ": loading the model", optimizer ? " and optimizer" : "", " from ", dir));
  if (optimizer) {
    contents.optim_wrapper =
        optim_state_with(*contents.optim_wrapper, save_optimizer_state(single_wrapper().optimizer()));
  }
  load_optim_and_schedulers(contents, optimizer, load_schedulers, path);
  return contents;
}

// Note [Resuming from PyTorch's DCP]
// A DCP directory that PyTorch wrote holds the model and the optimizer and
// nothing of lockstep's trainer: no iteration, data position or scheduler
// state. The iteration comes from the one counter it does hold, the
// optimizer's step count (every parameter's "step"; the largest, as a
// parameter that never had a gradient has none), times the accumulation
// window; the data loader then goes on at that iteration of its own order
// (as mmengine's loop advances its iterator on resume), and the schedulers are
// replayed to it (Runner::restore). A checkpoint without optimizer state
// resumes at iteration 0. Any strategy resumes from one, whatever wrote it:
// FSDP reads each rank's shards of it, DDP the whole model on every rank (as
// PyTorch's dcp.load does into a DDP model).
CheckpointContents Strategy::load_foreign_dcp(const std::string& path, bool load_optimizer) {
  const bool optimizer = load_optimizer && optim_wrapper_;
  const int64_t steps = read_dcp(path, optimizer, str_cat(path, ": loading PyTorch's distributed checkpoint"));
  const int64_t iteration = steps * (optimizer ? single_wrapper().accumulative_counts() : 1);
  if (collectives_->is_main_process()) {
    logger().info("{}: a torch.distributed.checkpoint without lockstep's trainer state: the optimizer has taken {} "
                  "step(s), so training goes on at iteration {}", path, steps, iteration);
  }
  CheckpointContents contents;
  State trainer;
  trainer.values = nlohmann::json{{"iteration", iteration}, {"next_iteration", iteration}};
  contents.trainer = std::move(trainer);
  return contents;
}

}  // namespace lockstep
