#include "lockstep/parallel/fsdp/flat_param.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "lockstep/compat/cuda.h"
#include "lockstep/compat/internal/storage.h"
#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/parallel/fsdp/internal/unit_wait.h"

namespace lockstep::fsdp {

void wait_for_unit(Work& work, const std::string& path, const char* what) {
  auto absent = [&](const DistributedError& error) {
    LOCKSTEP_FAIL("FSDP unit '", path.empty() ? "(root)" : path, "': ", what, ": ", error.what(),
                  ". The ranks named did not take part at this point of the step: they ran different units "
                  "(one skipped this unit, or took a data-dependent branch around it) or a different number of "
                  "steps, or stopped.");
  };
  try {
    work.wait();
  } catch (const TimeoutError& error) {
    absent(error);
  } catch (const PeerLostError& error) {
    absent(error);
  }
}

std::pair<double, double> gradient_divide_factors(int world_size) {
  int factor = 1;
  while (world_size % factor == 0 && world_size / factor > factor) factor *= 2;
  return {static_cast<double>(factor), static_cast<double>(world_size) / factor};
}

DivideFactors fully_shard_divide_factors(int shards, int replicas, torch::Dtype reduce_dtype) {
  DivideFactors factors;
  if (reduce_dtype == torch::kFloat32 || reduce_dtype == torch::kBFloat16) {
    factors.shard_postdivide = shards;
    factors.postdivide = replicas;
  } else {
    std::tie(factors.predivide, factors.postdivide) = gradient_divide_factors(shards * replicas);
  }
  return factors;
}

namespace {

// The edges of a unit's states (FlatParamUnit::State).
void move_unit_state(FlatParamUnit::State& state, FlatParamUnit::State next) {
  using State = FlatParamUnit::State;
  constexpr unsigned kMayComeFrom[] = {
      phase_bit(State::kGathered),                               // kSharded: resharded
      phase_bit(State::kSharded),                                // kGathering: a gather started
      phase_bit(State::kSharded) | phase_bit(State::kGathering)};  // kGathered
  constexpr const char* kNames[] = {"sharded", "gathering", "gathered"};
  move_phase("an FSDP unit", state, next, kMayComeFrom, kNames);
}

// The slots' current values in the padded flat layout, on the compute
// device, broadcast from the sync group's rank 0 when the setup has one.
torch::Tensor flat_of_slots(const std::vector<FlatSlot>& slots, const ShardLayout& layout, const UnitSetup& setup) {
  torch::Tensor flat = torch::zeros({layout.padded_numel}, slots.front().param.options().requires_grad(false));
  for (const auto& slot : slots) flat.narrow(0, slot.offset, slot.numel).copy_(slot.param.detach().reshape(-1));
  // The model may be on the host: only this unit moves to the compute device.
  flat = flat.to(setup.compute_device);
  if (setup.sync_group) setup.sync_group->broadcast(flat, 0);
  return flat;
}

}  // namespace

FlatParamUnit::FlatParamUnit(int index, std::string path, torch::nn::Module* module, std::vector<FlatSlot> slots,
                             UnitSetup setup, torch::Tensor prebuilt_shard)
    : index_(index), path_(std::move(path)), module_(module), slots_(std::move(slots)), setup_(std::move(setup)) {
  LOCKSTEP_CHECK(!slots_.empty(), "FSDP unit '", path_, "' has no parameters");
  const torch::Tensor& first = slots_.front().param;
  int64_t numel = 0;
  std::vector<std::vector<int64_t>> shapes;
  for (auto& slot : slots_) {
    LOCKSTEP_CHECK(slot.param.scalar_type() == first.scalar_type() && slot.param.device() == first.device(),
                   "FSDP unit '", path_.empty() ? "(root)" : path_,
                   "' mixes parameters of different dtypes or devices: ", slots_.front().name, " is ",
                   first.scalar_type(), " on ", first.device(), " but ", slot.name, " is ", slot.param.scalar_type(),
                   " on ", slot.param.device(), "; convert the model to one dtype and device before wrapping");
    slot.shape = slot.param.sizes().vec();
    slot.numel = slot.param.numel();
    slot.offset = numel;
    numel += slot.numel;
    shapes.push_back(slot.shape);
  }
  const int shard_rank = setup_.shard_group ? setup_.shard_group->rank() : 0;
  const int shard_world = setup_.shard_group ? setup_.shard_group->size() : 1;
  if (setup_.per_parameter) {
    layout_ = ShardLayout(per_parameter_blocks(shapes, shard_world), shard_rank, shard_world);
    for (size_t s = 0; s < slots_.size(); ++s) slots_[s].offset = layout_.blocks[s].full_offset;
    if (const auto& group = setup_.post_forward_group) {
      post_forward_layout_ = ShardLayout(per_parameter_blocks(shapes, group->size()), group->rank(), group->size());
    }
  } else {
    layout_ = ShardLayout(numel, shard_rank, shard_world);
  }
  aliases_shard_ = layout_.shard_world == 1 && setup_.param_dtype == first.scalar_type() &&
                   setup_.shard_device == setup_.compute_device;
  pinned_offload_ = !aliases_shard_ && setup_.shard_device.is_cpu() && setup_.compute_device.is_cuda() &&
                    compat::can_pin_memory();
  torch::NoGradGuard no_grad;
  const auto shard_options = torch::TensorOptions().dtype(first.scalar_type()).device(setup_.shard_device);
  const auto full_options = torch::TensorOptions().dtype(setup_.param_dtype).device(setup_.compute_device);
  // A shard cut while the model was built (shard_while_building.h): the
  // parameters are placeholders already, and the whole unit never exists here.
  const bool starts_sharded = prebuilt_shard.defined() && !aliases_shard_;
  if (prebuilt_shard.defined()) {
    LOCKSTEP_ASSERT(prebuilt_shard.numel() == layout_.shard_numel, "FSDP unit '", path_,
                    "': the shard cut while building holds ", prebuilt_shard.numel(), " elements, this layout needs ",
                    layout_.shard_numel);
    shard_ = prebuilt_shard.reshape(-1).to(shard_options);
    if (aliases_shard_) {
      full_ = shard_.detach();
    } else {
      full_ = torch::empty({layout_.padded_numel}, full_options);
      compat::free_storage(full_);
    }
  } else {
    torch::Tensor flat = flat_of_slots(slots_, layout_, setup_);
    if (aliases_shard_) {
      shard_ = flat;
      full_ = flat.detach();
    } else {
      shard_ = layout_.shard_of(flat).to(shard_options, /*non_blocking=*/false, /*copy=*/true);
      full_ = flat.to(full_options);
    }
  }
  // The shard is a leaf of its own (pinned under offload); the placeholders
  // are what parameters point at while sharded.
  if (pinned_offload_) shard_ = shard_.pin_memory();
  shard_.requires_grad_(true);
  empty_ = torch::empty({0}, full_.options());
  nan_ = torch::full({1}, std::numeric_limits<double>::quiet_NaN(), full_.options());
  gathered_version_ = static_cast<int64_t>(shard_._version());
  if (starts_sharded) move_unit_state(state_, State::kSharded);
  restore_param_views();
  if (starts_sharded && setup_.persistent) {
    start_gather();
    finish_gather();
  }
}

FlatParamUnit::~FlatParamUnit() {
  // Never leave a collective writing into memory about to be released.
  // (gradients_, destroyed first, waits for its reduction.)
  try {
    if (gather_work_) gather_work_->wait();
  } catch (...) {
  }
}

// Note [Shard staleness]
// A unit that stays gathered (the root, SHARD_GRAD_OP between forward and
// backward, summon_full_params) holds a copy of the shards that goes out of
// date when the shard changes. The shard's version counter cannot tell on its
// own: libtorch's C++ SGD updates `p.data()`, a tensor with a version counter
// of its own, so after an SGD step the shard's counter has not moved. (This
// is how FSDP once trained the root unit with step-0 weights forever.) So a
// change is recorded explicitly -- after every optimizer step and every load
// -- and the version counter only adds in-place changes made some other way.
bool FlatParamUnit::stale() const {
  return !aliases_shard_ && state_ != State::kSharded &&
         (shard_updated_ || gathered_version_ != static_cast<int64_t>(shard_._version()));
}

void FlatParamUnit::mark_shard_updated() { shard_updated_ = true; }

int64_t FlatParamUnit::gathered_bytes() const {
  if (aliases_shard_) return 0;
  const int64_t post = post_forward_shard_.defined() ? post_forward_shard_.numel() * post_forward_shard_.element_size() : 0;
  return static_cast<int64_t>(compat::storage_bytes(full_)) + post;
}

void FlatParamUnit::point_params_at(const torch::Tensor& flat) {
  for (auto& slot : slots_) slot.param.set_data(flat.narrow(0, slot.offset, slot.numel).view(slot.shape));
}

void FlatParamUnit::restore_param_views() {
  if (state_ != State::kSharded) {
    point_params_at(full_);
    return;
  }
  for (auto& slot : slots_) slot.param.set_data(intercepted_ ? empty_ : nan_.expand(slot.shape));
}

torch::Tensor FlatParamUnit::gather_full_precision() {
  if (layout_.shard_world > 1 && setup_.step_check) setup_.step_check->record(index_, StepCheck::Kind::kGather);
  return gather_in_full_layout(shard_);
}

torch::Tensor FlatParamUnit::gather_in_full_layout(const torch::Tensor& shard_shaped) const {
  torch::NoGradGuard no_grad;
  if (layout_.shard_world == 1) return shard_shaped.detach();
  torch::Tensor gathered = torch::empty({layout_.padded_numel}, shard_shaped.options().requires_grad(false));
  setup_.shard_group->all_gather_into_tensor(gathered, shard_shaped.detach().contiguous());
  if (!layout_.per_parameter()) return gathered;
  torch::Tensor flat = torch::zeros_like(gathered);
  layout_.gathered_to_full(gathered, flat);
  return flat;
}

void FlatParamUnit::mark_intercepted() {
  if (intercepted_) return;
  intercepted_ = true;
  if (state_ == State::kSharded) restore_param_views();
}

void FlatParamUnit::start_gather() {
  if (state_ != State::kSharded) return;
  torch::NoGradGuard no_grad;
  compat::allocate_storage(full_);
  gathered_version_ = static_cast<int64_t>(shard_._version());
  shard_updated_ = false;
  torch::Tensor source = shard_.detach();
  if (source.scalar_type() != full_.scalar_type() || source.device() != full_.device()) {
    // From pinned memory the copy to the GPU is queued on the current stream,
    // ahead of the all-gather that reads it.
    source = source.to(full_.options(), /*non_blocking=*/pinned_offload_);
  }
  if (layout_.shard_world == 1) {
    full_.copy_(source);
    move_unit_state(state_, State::kGathered);
    restore_param_views();
    return;
  }
  if (post_forward_shard_.defined()) {
    // Backward after reshard_after_forward: k: from the k-way part, over the small group.
    gathering_post_forward_ = true;
    gather_source_ = std::move(post_forward_shard_);
    post_forward_shard_ = torch::Tensor();
    gathered_ = torch::empty({post_forward_layout_.padded_numel}, full_.options());
    if (setup_.step_check) setup_.step_check->record(index_, StepCheck::Kind::kGather, /*detail=*/2);
    gather_work_ = setup_.post_forward_group->all_gather_into_tensor(gathered_, gather_source_, /*async=*/true);
    move_unit_state(state_, State::kGathering);
    return;
  }
  gather_source_ = source;
  // Per-parameter: into a rank-major buffer, copied out when it arrives.
  gathered_ = layout_.per_parameter() ? torch::empty_like(full_) : full_;
  if (setup_.step_check) setup_.step_check->record(index_, StepCheck::Kind::kGather);
  gather_work_ = setup_.shard_group->all_gather_into_tensor(gathered_, gather_source_, /*async=*/true);
  move_unit_state(state_, State::kGathering);
}

void FlatParamUnit::finish_gather() {
  LOCKSTEP_ASSERT(state_ != State::kSharded, "FSDP unit '", path_, "' finished a gather it never started");
  if (state_ == State::kGathered) return;
  auto work = std::move(gather_work_);
  gather_work_.reset();
  wait_for_unit(*work, path_, "gathering its parameters");
  gather_source_ = torch::Tensor();
  if (gathering_post_forward_) {
    torch::NoGradGuard no_grad;
    torch::Tensor part_full = torch::empty({post_forward_layout_.padded_numel}, full_.options());
    post_forward_layout_.gathered_to_full(gathered_, part_full);
    copy_between_layouts(post_forward_layout_, part_full, full_, layout_);
    gathering_post_forward_ = false;
  } else {
    layout_.gathered_to_full(gathered_, full_);
  }
  gathered_ = torch::Tensor();
  move_unit_state(state_, State::kGathered);
  restore_param_views();
}

void FlatParamUnit::refresh() {
  if (aliases_shard_ || state_ == State::kSharded) return;
  if (state_ == State::kGathering) finish_gather();
  if (!stale()) return;
  move_unit_state(state_, State::kSharded);  // the bytes stay allocated; start_gather overwrites them
  start_gather();
  finish_gather();
}

void FlatParamUnit::reshard() {
  post_forward_shard_ = torch::Tensor();
  if (setup_.persistent || aliases_shard_ || state_ == State::kSharded) return;
  if (state_ == State::kGathering) finish_gather();
  move_unit_state(state_, State::kSharded);
  restore_param_views();
  compat::free_storage(full_);
}

// Note [Resharding to a smaller group]
// PyTorch's fully_shard(reshard_after_forward=k) trades memory for
// communication between forward and backward: after its forward a unit
// keeps its parameters sharded over its group of k consecutive ranks (a node,
// typically) instead of over all N, so the all-gather its backward needs runs
// inside that group. Here the k-way part is cut from the gathered parameters
// in the k-way per-parameter layout (Note [Per-parameter layout]) when the
// forward ends, and the next gather collects it over the post-forward group
// and copies it into the N-way full layout. The values are the parameters'
// own bits either way (all-gathers copy), so training is bitwise the same as
// with reshard_after_forward: true; only memory and traffic differ.
void FlatParamUnit::reshard_after_forward() {
  if (!setup_.post_forward_group || setup_.persistent || aliases_shard_ || state_ == State::kSharded) {
    reshard();
    return;
  }
  if (state_ == State::kGathering) finish_gather();
  torch::NoGradGuard no_grad;
  torch::Tensor part_full = torch::zeros({post_forward_layout_.padded_numel}, full_.options());
  copy_between_layouts(layout_, full_, part_full, post_forward_layout_);
  torch::Tensor part = post_forward_layout_.shard_of(part_full).clone();
  reshard();
  post_forward_shard_ = std::move(part);
}

void FlatParamUnit::copy_between_layouts(const ShardLayout& from_layout, const torch::Tensor& from, torch::Tensor& to,
                                         const ShardLayout& to_layout) const {
  for (size_t s = 0; s < slots_.size(); ++s) {
    to.narrow(0, to_layout.blocks[s].full_offset, slots_[s].numel)
        .copy_(from.narrow(0, from_layout.blocks[s].full_offset, slots_[s].numel));
  }
}

ShardOverlap FlatParamUnit::shard_part(size_t slot) const {
  return layout_.part(slots_.at(slot).offset, slots_.at(slot).numel);
}

void FlatParamUnit::load_slice(int64_t offset, const torch::Tensor& values) {
  LOCKSTEP_CHECK(offset >= 0 && offset + values.numel() <= layout_.padded_numel, "FSDP unit '", path_,
                 "': elements [", offset, ", ", offset + values.numel(), ") cannot load into a layout of ",
                 layout_.padded_numel);
  const ShardOverlap part = layout_.part(offset, values.numel());
  if (part.length == 0) return;
  torch::NoGradGuard no_grad;
  shard_.narrow(0, part.in_shard, part.length).copy_(values.reshape(-1).narrow(0, part.in_range, part.length));
  shard_updated_ = true;
}

}  // namespace lockstep::fsdp
