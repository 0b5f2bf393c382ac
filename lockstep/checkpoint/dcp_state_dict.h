// An FSDP model and its optimizer as PyTorch's distributed checkpoint (DCP)
// holds them when a fully_shard model saves with (and a whole model, DDP's,
// read from one)
//
//   dcp.save({"model": get_model_state_dict(model),
//             "optim": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=dir)
//
// "model.<name>" is each parameter and buffer, "optim.state.<name>.<buffer>"
// each per-parameter state (exp_avg, exp_avg_sq, momentum_buffer, ...;
// "step" a 0-dim float32), "optim.param_groups.<g>.<key>" each group option
// as a Python object ("params" the group's parameter names), with
// PyTorch's names and PyTorch 2.14's keys. Every rank writes the elements it
// holds (each parameter's rows under FullyShard), so the boxes of a tensor
// are the ranks' shards, as fully_shard's DTensors save them; rank 0 writes
// the buffers, the steps and the groups. Loading reads, on every rank, only
// the boxes of the checkpoint that overlap its own elements, whatever world
// size, sharding or program (PyTorch, lockstep) wrote it.
//
//   lockstep::DcpRankPart part = lockstep::fsdp_dcp_part(*fsdp, optimizer.get(), /*main_rank=*/rank == 0);
//   // every rank: write_dcp_rank_file(dir, rank, part); rank 0 then write_dcp_metadata (FSDPStrategy)
//   int64_t steps = lockstep::load_fsdp_dcp(*fsdp, lockstep::DcpReader(dir), optimizer.get());
//   fsdp->shards_changed();                                   // collective: what is gathered is refreshed
//
// The optimizer must be over fsdp.named_orig_parameters() (FullyShard, or
// use_orig_params) and be SGD, Adam, AdamW or RMSprop, whose state PyTorch
// names the same way.
#pragma once

#include <cstdint>

#include <torch/optim/optimizer.h>

#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"

namespace lockstep {

// What this rank writes; `optimizer` may be null (the model only). The
// returned tensors alias the live shards: write them before the next step.
DcpRankPart fsdp_dcp_part(const FullyShardedDataParallel& fsdp, const torch::optim::Optimizer* optimizer,
                          bool main_rank);

// Loads this rank's elements of every parameter and the buffers, and with
// `optimizer` its state and group options (local; errors name the
// checkpoint and the entry). Returns the optimizer's step count, the
// largest of its parameters' (0 without optimizer state). Then, once every
// rank has loaded (an agreement), fsdp.shards_changed() on every rank.
int64_t load_fsdp_dcp(FullyShardedDataParallel& fsdp, const DcpReader& reader, torch::optim::Optimizer* optimizer);

// The same for a model this rank holds whole (DDP, one device): every
// element of each parameter and buffer, and with `optimizer` (over the
// model's own parameters) its state and group options, from a checkpoint
// of any layout (Note [A whole model from DCP]). Local; returns the
// optimizer's step count.
//   int64_t steps = lockstep::load_whole_model_dcp(*model, lockstep::DcpReader(dir), &optimizer);
int64_t load_whole_model_dcp(torch::nn::Module& model, const DcpReader& reader, torch::optim::Optimizer* optimizer);

}  // namespace lockstep
