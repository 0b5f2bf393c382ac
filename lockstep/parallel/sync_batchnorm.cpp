#include "lockstep/parallel/sync_batchnorm.h"

#include <torch/torch.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/core/shape_text.h"
#include "lockstep/comm/init.h"
#include "lockstep/optim/paramwise.h"

namespace lockstep {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Per-channel vectors (means, sums of squares, counts) are combined in float64:
// they are small, and the counts must stay exact integers.
constexpr auto kStatsType = torch::kDouble;

// Half and bfloat16 inputs are normalised in float32, as ATen's kernels do.
torch::ScalarType compute_type(const torch::Tensor& input) {
  auto type = input.scalar_type();
  return type == torch::kHalf || type == torch::kBFloat16 ? torch::kFloat : type;
}

// Every dimension but the channel one (1).
std::vector<int64_t> reduced_dims(int64_t dim) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < dim; ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against [N, C, *] in `type`.
torch::Tensor per_channel(const torch::Tensor& values, int64_t dim, torch::ScalarType type) {
  std::vector<int64_t> shape(dim, 1);
  shape[1] = values.numel();
  return values.to(type).view(shape);
}

// Carries the group from forward to backward through ctx->saved_data.
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(std::shared_ptr<ProcessGroup> group) : group(std::move(group)) {}
  std::shared_ptr<ProcessGroup> group;
};

// What both autograd functions keep for backward: input, weight (undefined
// without affine), the global mean and invstd, their own extras, the group.
void save_for_backward(AutogradContext* ctx, std::vector<torch::Tensor> tensors, std::shared_ptr<ProcessGroup> group) {
  ctx->save_for_backward(tensors);
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(std::move(group)));
}

struct SavedForBackward {
  torch::Tensor input, weight, mean, invstd;
  std::vector<torch::Tensor> extras;
  ProcessGroup* group;
};

SavedForBackward saved_for_backward(AutogradContext* ctx) {
  auto saved = ctx->get_saved_variables();
  auto capsule = ctx->saved_data["group"].toCapsule();
  return {saved[0], saved[1], saved[2], saved[3], {saved.begin() + 4, saved.end()},
          static_cast<GroupCapsule*>(capsule.get())->group.get()};
}

// The normalisation with global statistics, and its backward with the
// cross-rank reductions (what ATen's batch_norm_backward_reduce / _elemt do on
// CUDA; libtorch 1.13 has no CPU kernels for them, so this is plain tensor ops
// on every device). mean and invstd are float64 [C] constants of the graph:
// their dependence on the input is what the mean_dy / mean_dy_xmu terms of
// the backward account for.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  // weight and bias are optional (affine off) because libtorch 1.13 custom
  // functions reject undefined tensor arguments but accept nullopt.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               const c10::optional<torch::Tensor>& optional_weight,
                               const c10::optional<torch::Tensor>& optional_bias, const torch::Tensor& mean,
                               const torch::Tensor& invstd, double count, std::shared_ptr<ProcessGroup> group) {
    const auto weight = optional_weight.value_or(torch::Tensor());
    const auto bias = optional_bias.value_or(torch::Tensor());
    const auto type = compute_type(input);
    const int64_t dim = input.dim();
    auto scale = weight.defined() ? invstd * weight.to(kStatsType) : invstd;
    auto x = input.to(type);
    torch::Tensor output = (x - per_channel(mean, dim, type)) * per_channel(scale, dim, type);
    if (bias.defined()) output.add_(per_channel(bias, dim, type));
    save_for_backward(ctx, {input, weight, mean, invstd}, std::move(group));
    ctx->saved_data["count"] = count;
    return output.to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const SavedForBackward saved = saved_for_backward(ctx);
    const auto& [input, weight, mean, invstd, extras, group_pointer] = saved;
    auto& group = *group_pointer;
    const double count = ctx->saved_data["count"].toDouble();

    const auto type = compute_type(input);
    const int64_t dim = input.dim();
    const auto dims = reduced_dims(dim);
    auto dy = grad_outputs[0].to(type);
    auto xmu = input.to(type) - per_channel(mean, dim, type);
    // Sums over an empty local batch are zeros, so such a rank contributes
    // nothing but still takes part in the all_reduce below.
    auto sum_dy = dy.sum(dims).to(kStatsType);
    auto sum_dy_xmu = (dy * xmu).sum(dims).to(kStatsType);

    torch::Tensor grad_input, grad_weight, grad_bias;
    // needs_input_grad counts tensor arguments only: weight and bias are 1
    // and 2 when present (affine), and then both are.
    if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (weight.defined() && ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    // Whether the input needs a gradient is a property of the model, the same
    // on every rank, so either all ranks reduce here or none does.
    if (ctx->needs_input_grad(0)) {
      const int64_t channels = mean.numel();
      auto sums = torch::cat({sum_dy, sum_dy_xmu});
      group.all_reduce(sums, ReduceOp::kSum);
      auto mean_dy = sums.slice(0, 0, channels) / count;
      auto mean_dy_xmu = sums.slice(0, channels) / count;
      auto scale = weight.defined() ? invstd * weight.to(kStatsType) : invstd;
      // grad_input = w * invstd * (dy - mean(dy) - (x - mean) * invstd^2 * mean(dy * (x - mean)))
      auto centred = (dy - per_channel(mean_dy, dim, type)) - xmu * per_channel(invstd * invstd * mean_dy_xmu, dim, type);
      grad_input = (centred * per_channel(scale, dim, type)).to(input.scalar_type());
    }
    return {grad_input, grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// PyTorch's SyncBatchNorm function (torch/nn/modules/_functions.py) on
// libtorch's fused CUDA kernels, which have no CPU versions: the statistics
// come in from fused_synced_forward, the backward reduces sum(dy) and
// sum(dy * (x - mean)) in one all_reduce, as PyTorch's does.
struct FusedSyncBatchNormFunction : torch::autograd::Function<FusedSyncBatchNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               const c10::optional<torch::Tensor>& weight, const c10::optional<torch::Tensor>& bias,
                               const torch::Tensor& mean, const torch::Tensor& invstd, const torch::Tensor& counts,
                               double eps, std::shared_ptr<ProcessGroup> group) {
    save_for_backward(ctx, {input, weight.value_or(torch::Tensor()), mean, invstd, counts.to(torch::kInt)},
                      std::move(group));
    return at::batch_norm_elemt(input, weight, bias, mean, invstd, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const SavedForBackward saved = saved_for_backward(ctx);
    const auto& [input, weight, mean, invstd, extras, group_pointer] = saved;
    auto& group = *group_pointer;
    const torch::Tensor& counts = extras.at(0);
    const torch::Tensor grad_output = grad_outputs[0].contiguous(input.suggest_memory_format());
    const c10::optional<torch::Tensor> optional_weight =
        weight.defined() ? c10::optional<torch::Tensor>(weight) : c10::nullopt;
    const bool affine_grads = weight.defined();
    auto [sum_dy, sum_dy_xmu, grad_weight, grad_bias] =
        at::batch_norm_backward_reduce(grad_output, input, mean, invstd, optional_weight, ctx->needs_input_grad(0),
                                       affine_grads && ctx->needs_input_grad(1),
                                       affine_grads && ctx->needs_input_grad(2));
    torch::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {
      const int64_t channels = sum_dy.size(0);
      auto combined = torch::cat({sum_dy, sum_dy_xmu});
      group.all_reduce(combined, ReduceOp::kSum);
      c10::optional<torch::Tensor> elemt_weight = optional_weight;
      if (weight.defined() && weight.scalar_type() != mean.scalar_type()) elemt_weight = weight.to(mean.scalar_type());
      grad_input = at::batch_norm_backward_elemt(grad_output, input, mean, invstd, elemt_weight,
                                                 combined.slice(0, 0, channels), combined.slice(0, channels), counts);
    }
    return {grad_input,      grad_weight,     grad_bias,       torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

// --- options ----------------------------------------------------------------

SyncBatchNormOptions::SyncBatchNormOptions(int64_t num_features) : num_features_(num_features) {}

SyncBatchNormOptions::SyncBatchNormOptions(const torch::nn::BatchNormOptions& options,
                                           std::shared_ptr<ProcessGroup> group)
    : num_features_(options.num_features()),
      eps_(options.eps()),
      momentum_(options.momentum()),
      affine_(options.affine()),
      track_running_stats_(options.track_running_stats()),
      process_group_(std::move(group)) {}

// --- module -----------------------------------------------------------------

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_) : options(std::move(options_)) {
  LOCKSTEP_CHECK(options.num_features() > 0, "SyncBatchNorm: num_features must be positive, got ",
                 options.num_features());
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_, const torch::nn::Module& batch_norm)
    : options(std::move(options_)) {
  LOCKSTEP_CHECK(options.num_features() > 0, "SyncBatchNorm: num_features must be positive, got ",
                 options.num_features());
  auto parameters = batch_norm.named_parameters(/*recurse=*/false);
  auto buffers = batch_norm.named_buffers(/*recurse=*/false);
  auto take = [&](const torch::OrderedDict<std::string, torch::Tensor>& dict, const std::string& name, bool wanted) {
    const torch::Tensor* found = dict.find(name);
    LOCKSTEP_CHECK(!wanted || found != nullptr, "SyncBatchNorm: the module ", batch_norm.name(), " has no ", name,
                   " although its options say it should");
    return wanted ? *found : torch::Tensor();
  };
  register_state(take(parameters, "weight", options.affine()), take(parameters, "bias", options.affine()),
                 take(buffers, "running_mean", options.track_running_stats()),
                 take(buffers, "running_var", options.track_running_stats()),
                 take(buffers, "num_batches_tracked", options.track_running_stats()));
  train(batch_norm.is_training());
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  const bool track = options.track_running_stats();
  auto parameter = [&] { return options.affine() ? torch::empty({c}).requires_grad_() : torch::Tensor(); };
  register_state(parameter(), parameter(), track ? torch::empty({c}) : torch::Tensor(),
                 track ? torch::empty({c}) : torch::Tensor(), track ? torch::empty({}, torch::kLong) : torch::Tensor());
  reset_parameters();
}

void SyncBatchNormImpl::register_state(torch::Tensor weight_, torch::Tensor bias_, torch::Tensor running_mean_,
                                       torch::Tensor running_var_, torch::Tensor num_batches_tracked_) {
  // Same names, order and requires_grad as torch::nn::BatchNorm*d, including
  // the undefined entries it registers when a feature is off.
  weight = register_parameter("weight", weight_, weight_.defined() && weight_.requires_grad());
  bias = register_parameter("bias", bias_, bias_.defined() && bias_.requires_grad());
  running_mean = register_buffer("running_mean", running_mean_);
  running_var = register_buffer("running_var", running_var_);
  num_batches_tracked = register_buffer("num_batches_tracked", num_batches_tracked_);
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  torch::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  torch::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "lockstep::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << std::boolalpha << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

std::shared_ptr<ProcessGroup> SyncBatchNormImpl::process_group() const {
  if (options.process_group()) return options.process_group();
  return is_initialized() ? world() : nullptr;
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  LOCKSTEP_CHECK(input.defined(), "SyncBatchNorm: the input is undefined");
  LOCKSTEP_CHECK(input.dim() >= 2, "SyncBatchNorm: expected an input [N, C, *] with at least 2 dimensions, got ",
                 shape_text(input));
  LOCKSTEP_CHECK(input.size(1) == options.num_features(), "SyncBatchNorm: expected ", options.num_features(),
                 " channels in dimension 1 of the input, got shape ", shape_text(input));
  LOCKSTEP_CHECK(input.is_floating_point(), "SyncBatchNorm: expected a floating-point input, got ",
                 input.scalar_type());
  const bool batch_stats = is_training() || !options.track_running_stats();
  const bool update_stats = is_training() && options.track_running_stats();
  // Only training communicates: evaluation must work on any subset of ranks.
  auto group = is_training() ? process_group() : nullptr;
  const bool alone = group == nullptr || group->size() == 1;
  if (batch_stats && alone) {
    const int64_t per_channel_count = input.numel() / options.num_features();
    LOCKSTEP_CHECK(per_channel_count > 1, "SyncBatchNorm: expected more than 1 value per channel when training, ",
                   "got input of shape ", shape_text(input));
  }

  double average_factor = options.momentum().value_or(0.0);
  if (update_stats) {
    num_batches_tracked.add_(1);
    if (!options.momentum()) average_factor = 1.0 / num_batches_tracked.item<double>();
  }
  if (alone) {
    // Exactly BatchNorm*d's computation (same kernel, same running-stat update).
    return torch::nn::functional::batch_norm(input, running_mean, running_var,
                                             torch::nn::functional::BatchNormFuncOptions()
                                                 .weight(weight)
                                                 .bias(bias)
                                                 .training(batch_stats)
                                                 .momentum(average_factor)
                                                 .eps(options.eps()));
  }
  return synced_forward(input, *group, average_factor);
}

// Each rank sends its count, per-channel mean and sum of squared deviations
// from that mean (M2), and every rank combines them with Chan et al.'s
// parallel formula: M2 = sum_r M2_r + sum_r n_r (mean_r - mean)^2. All terms
// are non-negative, so there is no cancellation, unlike an all_reduce of
// [sum, sum of squares, count] whose E[x^2] - E[x]^2 loses every digit when
// |mean| >> std. (PyTorch gathers [mean, invstd, count] for the same reason;
// M2 avoids the round trip through eps.) One all_gather of 2C+1 float64 per rank.
torch::Tensor SyncBatchNormImpl::synced_forward(const torch::Tensor& input, ProcessGroup& group,
                                                double average_factor) {
  if (input.is_cuda()) return fused_synced_forward(input, group, average_factor);
  const int64_t channels = options.num_features();
  const int64_t local_count = input.numel() / channels;
  auto stats_options = torch::TensorOptions().dtype(kStatsType).device(input.device());
  auto local = torch::zeros({2 * channels + 1}, stats_options);
  torch::Tensor mean, invstd;
  double total_count = 0;
  {
    torch::NoGradGuard no_grad;
    if (local_count > 0) {
      // The corrected two-pass algorithm: x - rough_mean is exact where x is
      // near the mean (Sterbenz), so M2 keeps its digits however large |mean|
      // is. (A float32 Welford pass, var_mean, missed the variance by more than
      // 1e-4 relative at |mean|/std = 1e4; see LargeMeansKeepAccurateVariance.)
      const auto dims = reduced_dims(input.dim());
      const double n = static_cast<double>(local_count);
      auto x = input.to(compute_type(input));
      auto rough_mean = x.mean(dims, /*keepdim=*/true);
      auto centred = x - rough_mean;
      auto sum = centred.sum(dims).to(kStatsType);
      auto sum_squares = centred.square().sum(dims).to(kStatsType);
      local.slice(0, 0, channels).copy_(rough_mean.flatten().to(kStatsType) + sum / n);
      local.slice(0, channels, 2 * channels).copy_(sum_squares - sum * sum / n);
      local[2 * channels].fill_(n);
    }
    auto gathered = torch::empty({group.size() * (2 * channels + 1)}, stats_options);
    group.all_gather_into_tensor(gathered, local);
    gathered = gathered.view({group.size(), 2 * channels + 1});
    auto counts = gathered.select(1, 2 * channels).unsqueeze(1);
    const double total = counts.sum().item<double>();
    LOCKSTEP_CHECK(total > 1, "SyncBatchNorm: expected more than 1 value per channel when training, got ", total,
                   " over the ", group.size(), " ranks of group ", group.name(), " (rank ", group.rank(),
                   " input shape ", shape_text(input), ")");
    auto means = gathered.slice(1, 0, channels);
    mean = (means * counts).sum(0) / total;
    auto m2 = gathered.slice(1, channels, 2 * channels).sum(0) + ((means - mean).square() * counts).sum(0);
    invstd = (m2 / total + options.eps()).rsqrt();
    if (is_training() && options.track_running_stats()) {
      auto unbiased_var = m2 / (total - 1);
      running_mean.copy_(running_mean.to(kStatsType) * (1 - average_factor) + mean * average_factor);
      running_var.copy_(running_var.to(kStatsType) * (1 - average_factor) + unbiased_var * average_factor);
    }
    total_count = total;
  }
  auto optional = [](const torch::Tensor& t) { return t.defined() ? c10::optional<torch::Tensor>(t) : c10::nullopt; };
  return SyncBatchNormFunction::apply(input, optional(weight), optional(bias), mean, invstd, total_count,
                                      group.shared_from_this());
}

// What PyTorch's SyncBatchNorm does on CUDA, step for step: per-rank
// [mean, invstd, count] from batch_norm_stats, one all_gather, the global
// statistics (and the running-stat update) from
// batch_norm_gather_stats_with_counts, ranks with an empty batch left out.
torch::Tensor SyncBatchNormImpl::fused_synced_forward(const torch::Tensor& input_, ProcessGroup& group,
                                                      double average_factor) {
  const torch::Tensor input = input_.contiguous(input_.suggest_memory_format());
  const int64_t channels = options.num_features();
  const int64_t local_count = input.numel() / channels;
  // The statistics and their exchange record no graph: FusedSyncBatchNormFunction
  // differentiates the whole layer itself, as PyTorch's forward runs inside an
  // autograd.Function. With grad mode on, the gathered statistics carried the
  // input's history into the collective, which refused it on the H100
  // ("a leaf Variable that requires grad is being used in an in-place operation").
  const bool caller_grad_mode = torch::GradMode::is_enabled();
  torch::NoGradGuard no_grad;
  torch::Tensor local_mean, local_invstd;
  if (local_count > 0) {
    std::tie(local_mean, local_invstd) = at::batch_norm_stats(input, options.eps());
  } else {
    // The dtype batch_norm_stats gives the other ranks: float64 for double input, float32 otherwise.
    local_mean = torch::zeros({channels}, input.options().dtype(input.scalar_type() == torch::kDouble ? torch::kDouble
                                                                                                      : torch::kFloat));
    local_invstd = torch::zeros({channels}, local_mean.options());
  }
  auto local = torch::cat({local_mean, local_invstd, torch::full({1}, static_cast<double>(local_count),
                                                                  local_mean.options())});
  auto gathered = torch::empty({group.size() * local.numel()}, local.options());
  group.all_gather_into_tensor(gathered, local);
  gathered = gathered.view({group.size(), local.numel()});
  auto mean_all = gathered.slice(1, 0, channels);
  auto invstd_all = gathered.slice(1, channels, 2 * channels);
  auto count_all = gathered.slice(1, 2 * channels, 2 * channels + 1);
  const double total = count_all.sum().item<double>();
  LOCKSTEP_CHECK(total > 1, "SyncBatchNorm: expected more than 1 value per channel when training, got ", total,
                 " over the ", group.size(), " ranks of group ", group.name(), " (rank ", group.rank(),
                 " input shape ", shape_text(input), ")");
  const auto present = count_all.squeeze(-1) >= 1;
  mean_all = mean_all.index({present});
  invstd_all = invstd_all.index({present});
  auto counts = count_all.index({present}).view(-1);
  const bool update_stats = is_training() && options.track_running_stats();
  if (update_stats && counts.scalar_type() != running_mean.scalar_type()) counts = counts.to(running_mean.scalar_type());
  auto optional = [](const torch::Tensor& t) { return t.defined() ? c10::optional<torch::Tensor>(t) : c10::nullopt; };
  torch::Tensor mean, invstd;
  std::tie(mean, invstd) = at::batch_norm_gather_stats_with_counts(
      input, mean_all, invstd_all, update_stats ? optional(running_mean) : c10::nullopt,
      update_stats ? optional(running_var) : c10::nullopt, average_factor, options.eps(), counts);
  torch::AutoGradMode caller_mode(caller_grad_mode);  // the layer's own node, as the caller asked
  return FusedSyncBatchNormFunction::apply(input, optional(weight), optional(bias), mean, invstd, counts,
                                           options.eps(), group.shared_from_this());
}

// --- conversion ---------------------------------------------------------------

namespace {

// Walks a module tree once, replacing BatchNorm children everywhere they are
// stored: the parent's registry (what parameters() and state dicts see) and,
// for the containers, the list their forward iterates.
// paramwise_cfg's norm_decay_mult reaches SyncBatchNorm, as mmengine's
// _BatchNorm check does: the optimizer may be built after the conversion.
const bool kSyncBatchNormIsANorm = [] {
  add_module_traits_reader([](const torch::nn::Module& module, ModuleTraits& traits) {
    if (dynamic_cast<const SyncBatchNormImpl*>(&module) != nullptr) traits.norm = true;
  });
  return true;
}();

class SyncBatchNormConverter {
 public:
  explicit SyncBatchNormConverter(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}

  // The SyncBatchNorm for `module`, or nullptr if it is no BatchNorm.
  std::shared_ptr<SyncBatchNormImpl> convert(const std::shared_ptr<torch::nn::Module>& module) {
    auto found = converted_.find(module.get());
    if (found != converted_.end()) return found->second;
    const torch::nn::BatchNormOptions* options = nullptr;
    if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module)) options = &bn->options;
    if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module)) options = &bn->options;
    if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(module)) options = &bn->options;
    if (options == nullptr) return nullptr;
    auto sync = std::make_shared<SyncBatchNormImpl>(SyncBatchNormOptions(*options, group_), *module);
    converted_.emplace(module.get(), sync);
    keep_alive_.push_back(module);
    return sync;
  }

  void visit(const std::shared_ptr<torch::nn::Module>& parent, const std::string& path) {
    if (!visited_.insert(parent.get()).second) return;
    for (const auto& child : parent->named_children()) {
      const std::string child_path = path.empty() ? child.key() : path + "." + child.key();
      auto sync = convert(child.value());
      if (sync == nullptr) {
        visit(child.value(), child_path);
        continue;
      }
      replace(*parent, child.key(), child.value().get(), sync);
      replaced_.emplace_back(child_path, child.value());
    }
  }

  // Paths of replaced modules that something outside the tree still holds.
  std::vector<std::string> still_referenced() {
    converted_.clear();
    keep_alive_.clear();
    std::vector<std::string> paths;
    for (const auto& [path, old] : replaced_) {
      if (!old.expired()) paths.push_back(path);
    }
    return paths;
  }

 private:
  static void replace(torch::nn::Module& parent, const std::string& name, const torch::nn::Module* old,
                      const std::shared_ptr<SyncBatchNormImpl>& sync) {
    if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
      for (auto& entry : *sequential) {
        if (entry.ptr().get() == old) entry = torch::nn::AnyModule(sync);
      }
    } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
      for (auto& entry : *list) {
        if (entry.get() == old) entry = sync;
      }
    } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
      dict->update(std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{{name, sync}});
    }
    parent.replace_module(name, std::static_pointer_cast<torch::nn::Module>(sync));
  }

  std::shared_ptr<ProcessGroup> group_;
  std::unordered_map<const torch::nn::Module*, std::shared_ptr<SyncBatchNormImpl>> converted_;
  // The old modules stay alive until the end so that no address is reused.
  std::vector<std::shared_ptr<torch::nn::Module>> keep_alive_;
  std::unordered_set<const torch::nn::Module*> visited_;
  std::vector<std::pair<std::string, std::weak_ptr<torch::nn::Module>>> replaced_;
};

}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          std::shared_ptr<ProcessGroup> group) {
  LOCKSTEP_CHECK(module != nullptr, "convert_sync_batchnorm: the module is null");
  SyncBatchNormConverter converter(std::move(group));
  if (auto sync = converter.convert(module)) return sync;
  converter.visit(module, "");
  auto stale = converter.still_referenced();
  if (!stale.empty()) {
    std::string paths;
    for (const auto& path : stale) paths += (paths.empty() ? "" : ", ") + path;
    LOCKSTEP_FAIL("convert_sync_batchnorm: replaced BatchNorm module(s) ", paths, " of ", module->name(),
                  " are still referenced outside the module tree, most likely by a torch::nn::BatchNorm*d member "
                  "that forward() calls, which would keep normalising with local statistics. Declare the member "
                  "as lockstep::SyncBatchNorm (or put it in a torch::nn::Sequential), or drop other handles to it "
                  "before converting");
  }
  return module;
}

}  // namespace lockstep
