// FlatParamUnit: one FSDP unit's parameters as a single flat, padded buffer
// split into equal shards, one per rank of the shard group.
//
// The module keeps its own parameter tensors (a LinearImpl's `weight` member
// stays valid): only what they point at changes (PyTorch's
// use_orig_params=True).
//   - gathered: each parameter is a view into `full`, the padded flat buffer
//     in the compute dtype, filled by all_gather_into_tensor of the shards;
//   - sharded: `full`'s bytes are released inside its Storage (which
//     autograd's saved views keep) and each parameter is a placeholder that
//     owns no memory: an empty tensor (shape [0], so a stray read fails on
//     its shape instead of reading freed memory) once the unit is known to be
//     intercepted, and before that a NaN of the parameter's shape (one element,
//     expanded), so that a forward FSDP never saw still runs and FSDP can name
//     the unit before backward (see FullyShardedDataParallel).
// The rank's shard is a leaf tensor of its own (full precision, on the host
// with offload): the optimizer steps it and gradients are reduce-scattered
// into its .grad.
//
//   FlatParamUnit unit(index, "blocks.3", module, slots, setup);
//   unit.start_gather(); unit.finish_gather();   // parameters usable
//   unit.reshard();                              // parameters [0], memory released
//   unit.gradients().start_reduce(); ...; unit.gradients().finish_reduce();  // .grad of the shard
//
// Layout: the slots' elements back to back in slot order, then zeros up to
// a multiple of the shard group's size; rank r owns [r*S, (r+1)*S)
// (flat_layout.h, which holds the arithmetic without the unit).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/torch.h>

#include "lockstep/compat/autograd.h"
#include "lockstep/parallel/fsdp/flat_layout.h"
#include "lockstep/parallel/fsdp/shard_gradients.h"
#include "lockstep/parallel/fsdp/step_check.h"  // also declares ProcessGroup and Work

namespace lockstep::fsdp {

// One original parameter inside a flat parameter.
struct FlatSlot {
  std::string name;                  // first dotted name in the model
  std::vector<std::string> aliases;  // further names of the same tensor (tied parameters)
  torch::Tensor param;               // the module's own tensor
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
  int64_t model_index = -1;          // among the model's unique trainable parameters; -1: frozen
  // false: a frozen parameter (requires_grad false), sharded with the unit
  // but never reduced nor stepped (FullyShard only; FSDP1 keeps them whole).
  bool trainable = true;
};

struct UnitSetup {
  std::shared_ptr<ProcessGroup> shard_group;      // null: one rank holds the whole flat parameter
  std::shared_ptr<ProcessGroup> replicate_group;  // gradients are all-reduced over it (NO_SHARD, HYBRID_SHARD)
  torch::Dtype param_dtype = torch::kFloat32;     // of the gathered parameters
  torch::Dtype reduce_dtype = torch::kFloat32;    // of gradient communication
  torch::Device compute_device = torch::kCPU;
  torch::Device shard_device = torch::kCPU;
  bool persistent = false;                        // never freed (root, NO_SHARD; Note [The root unit])
  // Gradients are divided by `predivide` before the reduction (a sum) and by
  // `postdivide` after it; their product is the data-parallel world size.
  // PyTorch's FSDP splits the division this way (about sqrt(N) each) so that
  // low-precision gradients neither overflow in the sum nor underflow before it
  // (Note [FSDP's pre- and post-divide] in shard_gradients.cpp).
  double predivide = 1;
  double postdivide = 1;
  // FullyShard's HSDP averages twice, as PyTorch's fully_shard does: by the
  // shard group's size after the reduce-scatter (before the replicas'
  // all-reduce) and by the replicas' count after it (`postdivide`).
  double shard_postdivide = 1;
  // FSDP2's layout and reduction (PyTorch's fully_shard): each parameter is
  // sharded on dim 0 on its own (Note [Per-parameter layout]), and only the
  // parameters that received a gradient are reduced; the others keep none
  // (Note [FSDP2's gradients] in shard_gradients.cpp).
  bool per_parameter = false;
  // FullyShard's reshard_after_forward: k (per-parameter only): after its
  // forward the unit keeps this rank's part of a k-way sharding over this
  // group of k consecutive ranks, and its backward gathers from that over the
  // group (Note [Resharding to a smaller group]). Null: after forward it
  // reshards over the whole shard group.
  std::shared_ptr<ProcessGroup> post_forward_group;
  StepCheck* step_check = nullptr;                // told about every collective the unit issues
  // Set: the flat parameter is broadcast from this group's rank 0 when the
  // unit is built, on the compute device (sync_module_states, a unit at a time).
  std::shared_ptr<ProcessGroup> sync_group;
};

// PyTorch's split of the world size N into (pre, post) divisors, as
// DefaultState._get_gradient_predivide_factor computes it: pre doubles from 1
// while it divides N and N / pre > pre (N=2: 2, 1; N=4: 2, 2; N=8: 4, 2;
// N=16: 4, 4); post = N / pre. See Note [FSDP's pre- and post-divide].
std::pair<double, double> gradient_divide_factors(int world_size);
// fully_shard's divisions (FSDP2's _get_gradient_divide_factors) for a shard
// group of `shards` ranks and `replicas` of it (HSDP; 1 without): with
// reduce_dtype fp32 or bf16 none before the sums, and after each sum its own
// group's size (its ReduceOp.AVG, which Gloo computes as the sum divided by
// the group's size); otherwise FSDP1's split of shards * replicas, after all.
struct DivideFactors {
  double predivide = 1;
  double shard_postdivide = 1;
  double postdivide = 1;
};
DivideFactors fully_shard_divide_factors(int shards, int replicas, torch::Dtype reduce_dtype);

class FlatParamUnit {
 public:
  enum class State { kSharded, kGathering, kGathered };

  // Copies the slots' current values (wherever they are) into the flat
  // layout on the compute device, broadcasts it with `sync_group`, keeps this
  // rank's shard and leaves the unit gathered. With `prebuilt_shard` (cut
  // while building, shard_while_building.h) the slots' values are not read:
  // that is the shard, and the unit starts sharded (persistent ones gathered).
  FlatParamUnit(int index, std::string path, torch::nn::Module* module, std::vector<FlatSlot> slots, UnitSetup setup,
                torch::Tensor prebuilt_shard = torch::Tensor());
  ~FlatParamUnit();
  C10_DISABLE_COPY_AND_ASSIGN(FlatParamUnit);

  int index() const { return index_; }
  const std::string& path() const { return path_; }  // "" for the root
  torch::nn::Module* module() const { return module_; }
  const std::vector<FlatSlot>& slots() const { return slots_; }
  // The flat layout's sizes and this rank's shard of it.
  const ShardLayout& layout() const { return layout_; }
  const UnitSetup& setup() const { return setup_; }
  // The gathered buffer is the shard itself (one rank per shard group, same
  // dtype and device): gathering and freeing are no-ops.
  bool aliases_shard() const { return aliases_shard_; }
  // The optimizer's leaf: this rank's part of the flat parameter.
  const torch::Tensor& shard() const { return shard_; }
  // The gathered flat buffer (its storage holds 0 bytes while sharded).
  const torch::Tensor& full() const { return full_; }
  State state() const { return state_; }
  // The gathered copy may be older than the shard: the shard was loaded, or
  // stepped (mark_shard_updated), or changed in place through an operation
  // that bumps its version counter, since the last gather. See Note [Shard
  // staleness] in flat_param.cpp.
  bool stale() const;
  // The optimizer stepped the shard (FSDP calls it after every step).
  void mark_shard_updated();
  // Bytes of the gathered buffer while it holds memory of its own.
  int64_t gathered_bytes() const;

  // The whole flat parameter (padded layout) in the shard's own dtype -- full
  // precision under mixed precision -- gathered from every rank's shard
  // (collective over the shard group); the shard itself with one rank.
  torch::Tensor gather_full_precision();
  // The same for any tensor laid out as the shard (optimizer state): the
  // whole layout on every rank of the shard group (collective; not recorded
  // by the step check).
  torch::Tensor gather_in_full_layout(const torch::Tensor& shard_shaped) const;
  // Points the parameters at views of `flat` (this unit's padded layout), or
  // back at what the unit's state says: the gathered buffer, or placeholders
  // while sharded.
  void point_params_at(const torch::Tensor& flat);
  void restore_param_views();

  // Starts the all-gather (collective over the shard group; no-op unless sharded).
  void start_gather();
  // Waits for it and points the parameters at the gathered buffer.
  void finish_gather();
  // Gathers again if stale (a collective whenever any rank may be stale:
  // call it at the same point on every rank).
  void refresh();
  // Frees the gathered buffer (not for persistent units).
  void reshard();
  // FULL_SHARD's free after forward: reshard(), or with a post-forward group
  // keeps this rank's part of the smaller sharding first, which the next
  // start_gather gathers from (over that group).
  void reshard_after_forward();
  // The unit's forward is known to be intercepted: from now on its sharded
  // parameters are [0]-shaped (see the top of this file).
  void mark_intercepted();
  bool intercepted() const { return intercepted_; }

  // The gradient side: absorbing autograd's gradients, reducing them into
  // shard().grad(), use_orig_params' views (shard_gradients.h).
  ShardGradients& gradients() { return gradients_; }
  const ShardGradients& gradients() const { return gradients_; }

  // Sets `values` [offset, offset + numel) of the layout (only the part this
  // rank owns; the whole layout from offset 0 loads the whole shard). Local;
  // the unit is stale afterwards.
  void load_slice(int64_t offset, const torch::Tensor& values);

  // The part of slot `slot` this rank's shard holds.
  ShardOverlap shard_part(size_t slot) const;

  // Autograd hooks, one per slot (null for a frozen one), kept here so they live as long as the unit.
  std::vector<std::unique_ptr<compat::PostAccumulateHook>>& hooks() { return hooks_; }

 private:
  // Reads the slots' storage and layout, and offload (slots_, pinned_offload_).
  friend class ShardGradients;

  // Copies every parameter from `from` (in from_layout's full layout) into
  // `to` (in to_layout's); both per-parameter layouts of these slots.
  void copy_between_layouts(const ShardLayout& from_layout, const torch::Tensor& from, torch::Tensor& to,
                            const ShardLayout& to_layout) const;

  int index_;
  std::string path_;
  torch::nn::Module* module_;
  std::vector<FlatSlot> slots_;
  UnitSetup setup_;
  ShardLayout layout_;
  bool aliases_shard_ = false;  // `full` is the shard itself (one rank, same dtype and device)
  // CPU offload from a GPU: the shard and its gradient live in page-locked
  // memory, so copies between them and the GPU are asynchronous.
  bool pinned_offload_ = false;
  torch::Tensor shard_;
  torch::Tensor full_;
  torch::Tensor empty_;         // what parameters point at while sharded
  torch::Tensor nan_;           // one NaN, expanded to each shape while not intercepted yet
  bool intercepted_ = false;
  // Moved by move_unit_state: sharded -> gathering -> gathered (or sharded ->
  // gathered in one go) -> sharded, asserted.
  State state_ = State::kGathered;
  int64_t gathered_version_ = 0;
  bool shard_updated_ = false;  // since the last gather
  std::shared_ptr<Work> gather_work_;
  torch::Tensor gather_source_;
  torch::Tensor gathered_;  // per-parameter layout: the all-gather's rank-major result, until copied out
  ShardLayout post_forward_layout_;  // with a post-forward group: the k-way layout
  torch::Tensor post_forward_shard_;  // after forward: this rank's part of it
  bool gathering_post_forward_ = false;
  std::vector<std::unique_ptr<compat::PostAccumulateHook>> hooks_;
  ShardGradients gradients_{*this};  // last: destroyed first, it waits for its reduction
};

}  // namespace lockstep::fsdp
