#include "lockstep/parallel/ddp/powersgd_hook.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <sstream>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/process_group.h"

namespace lockstep {

PowerSGDOptions parse_powersgd_options(const Config& config) {
  PowerSGDOptions defaults;
  PowerSGDOptions options;
  options.matrix_approximation_rank(config.get<int64_t>("matrix_approximation_rank", defaults.matrix_approximation_rank()));
  options.start_powerSGD_iter(config.get<int64_t>("start_powerSGD_iter", defaults.start_powerSGD_iter()));
  options.min_compression_rate(config.get<double>("min_compression_rate", defaults.min_compression_rate()));
  options.use_error_feedback(config.get<bool>("use_error_feedback", defaults.use_error_feedback()));
  options.warm_start(config.get<bool>("warm_start", defaults.warm_start()));
  options.orthogonalization_epsilon(config.get<double>("orthogonalization_epsilon", defaults.orthogonalization_epsilon()));
  options.random_seed(config.get<int64_t>("random_seed", defaults.random_seed()));
  options.compression_stats_logging_frequency(
      config.get<int64_t>("compression_stats_logging_frequency", defaults.compression_stats_logging_frequency()));
  options.batch_tensors_with_same_shape(
      config.get<bool>("batch_tensors_with_same_shape", defaults.batch_tensors_with_same_shape()));
  LOCKSTEP_CHECK(options.matrix_approximation_rank() >= 1, config.where("matrix_approximation_rank"),
                 ": must be at least 1, got ", options.matrix_approximation_rank());
  LOCKSTEP_CHECK(options.random_seed() >= 0 && options.random_seed() <= int64_t{0xFFFFFFFF}, config.where("random_seed"),
                 ": must be between 0 and 2**32 - 1 (numpy's RandomState), got ", options.random_seed());
  // PyTorch's rule: DDP rebuilds its buckets after the first iteration, so
  // memories keyed by bucket may only start from the second (Note [Bucket order and rebuild]).
  LOCKSTEP_CHECK(!(options.use_error_feedback() || options.warm_start()) || options.start_powerSGD_iter() > 1,
                 config.where("start_powerSGD_iter"), ": must be > 1 when use_error_feedback or warm_start is on, "
                 "because PowerSGD can only be applied after the first two iterations in DDP (got ",
                 options.start_powerSGD_iter(), ")");
  return options;
}

int64_t LegacyNumpyRandom::randint(int64_t high) {
  LOCKSTEP_CHECK(high > 0 && high <= (int64_t{1} << 32), "randint: high must be in (0, 2^32], got ", high);
  const uint32_t range = static_cast<uint32_t>(high - 1);  // numpy's rng: the largest value drawn
  if (range == 0) return 0;
  if (range == 0xFFFFFFFFu) return engine_();
  uint32_t mask = range;  // smallest 2^k - 1 >= range
  for (int shift = 1; shift < 32; shift <<= 1) mask |= mask >> shift;
  uint32_t value = 0;
  while ((value = static_cast<uint32_t>(engine_()) & mask) > range) {
  }
  return value;
}

std::string LegacyNumpyRandom::save() const {
  std::ostringstream out;
  out << engine_;
  return out.str();
}

void LegacyNumpyRandom::load(const std::string& text) {
  std::istringstream in(text);
  in >> engine_;
  LOCKSTEP_CHECK(!in.fail(), "PowerSGD: the saved random generator state does not parse");
}

void orthogonalize(torch::Tensor matrices, double epsilon) {
  LOCKSTEP_CHECK(matrices.dim() == 3 && matrices.size(2) <= matrices.size(1),
                 "orthogonalize: expects a batch of n x r matrices with r <= n, got ", matrices.sizes());
  const int64_t rank = matrices.size(2);
  const auto dtype = matrices.scalar_type();
  if (rank <= 2 || dtype == torch::kHalf || dtype == torch::kBFloat16) {
    for (int64_t i = 0; i < rank; ++i) {
      torch::Tensor column = matrices.narrow(2, i, 1);
      torch::Tensor norm = at::frobenius_norm(column, {1}, /*keepdim=*/true);
      if (epsilon != 0) norm = norm + epsilon;
      column.div_(norm);
      if (i + 1 < rank) {
        torch::Tensor rest = matrices.narrow(2, i + 1, rank - i - 1);
        rest.sub_(at::sum(column * rest, {1}, /*keepdim=*/true) * column);
      }
    }
    return;
  }
  matrices.copy_(std::get<0>(at::linalg_qr(matrices, "reduced")));
}

PowerSGDBase::PowerSGDBase(PowerSGDOptions options)
    : options_(options), rng_(static_cast<uint32_t>(options.random_seed())) {
  options_.compression_stats_logging_frequency(std::max<int64_t>(1, options_.compression_stats_logging_frequency()));
}

void PowerSGDBase::log_config_once() {
  if (logged_config_) return;
  logged_config_ = true;
  logger().info("PowerSGD config: matrix_approximation_rank = {}; start_powerSGD_iter = {}; min_compression_rate = "
                "{}; orthogonalization_epsilon = {}; use_error_feedback = {}; warm_start = {}; random_seed = {}; "
                "batch_tensors_with_same_shape = {}",
                options_.matrix_approximation_rank(), options_.start_powerSGD_iter(), options_.min_compression_rate(),
                options_.orthogonalization_epsilon(), options_.use_error_feedback(), options_.warm_start(),
                options_.random_seed(), options_.batch_tensors_with_same_shape());
}

void PowerSGDBase::maybe_increase_iter(const GradBucket& bucket) {
  if (bucket.is_last()) {
    ++iter_;
    if (iter_ == options_.start_powerSGD_iter()) logger().info("Start to apply PowerSGD after {} iterations.", iter_);
  }
}

std::tuple<double, int64_t, int64_t> PowerSGDBase::compression_stats() const {
  const double rate = total_after_ > 0 ? static_cast<double>(total_before_) / static_cast<double>(total_after_) : 0;
  return {rate, total_before_, total_after_};
}

void PowerSGDBase::report_compression_stats(const GradBucket& bucket) {
  if (!bucket.is_last() || iter_ < next_stats_report_) return;
  auto [rate, before, after] = compression_stats();
  logger().info("Compression stats: iter {}, total before compression {}, total after compression {}, rate {}", iter_,
                before, after, rate);
  next_stats_report_ = iter_ + options_.compression_stats_logging_frequency();
}

std::unique_ptr<PendingReduction> PowerSGDBase::plain_all_reduce(ProcessGroup& group, const GradBucket& bucket) {
  log_config_once();
  maybe_increase_iter(bucket);
  return all_reduce_average(group, bucket.buffer());
}

at::Generator PowerSGDBase::next_q_generator() {
  return at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(rng_.randint(1000000000)));
}

State PowerSGDBase::state() const {
  State state;
  state.values["iter"] = iter_;
  state.values["total_numel_before_compression"] = total_before_;
  state.values["total_numel_after_compression"] = total_after_;
  state.values["next_stats_report"] = next_stats_report_;
  state.values["rng"] = rng_.save();
  for (const auto& [index, tensor] : error_) state.tensors["error." + std::to_string(index)] = tensor;
  for (const auto& [index, tensor] : p_memory_) state.tensors["p." + std::to_string(index)] = tensor;
  for (const auto& [index, tensor] : q_memory_) state.tensors["q." + std::to_string(index)] = tensor;
  return state;
}

void PowerSGDBase::load_state(const State& state) {
  LOCKSTEP_CHECK(state.values.is_object() && state.values.contains("iter") && state.values.contains("rng"), name(),
                 " comm hook: the checkpoint holds no state for it (was it written with another comm_hook?)");
  iter_ = state.values.at("iter").get<int64_t>();
  total_before_ = state.values.at("total_numel_before_compression").get<int64_t>();
  total_after_ = state.values.at("total_numel_after_compression").get<int64_t>();
  next_stats_report_ = state.values.at("next_stats_report").get<int64_t>();
  rng_.load(state.values.at("rng").get<std::string>());
  error_.clear();
  p_memory_.clear();
  q_memory_.clear();
  for (const auto& [key, tensor] : state.tensors) {
    const auto dot = key.find('.');
    LOCKSTEP_CHECK(dot != std::string::npos, name(), " comm hook: unexpected state tensor '", key, "'");
    const std::string kind = key.substr(0, dot);
    const int64_t index = std::stoll(key.substr(dot + 1));
    auto& memory = kind == "error" ? error_ : kind == "p" ? p_memory_ : q_memory_;
    LOCKSTEP_CHECK(kind == "error" || kind == "p" || kind == "q", name(), " comm hook: unexpected state tensor '", key,
                   "'");
    memory[index] = tensor.clone();
  }
}

bool PowerSGDBase::load_state_from_other_world_size(const State& rank0) {
  load_state(rank0);
  error_.clear();
  return true;
}

namespace {

// Memories loaded from a checkpoint arrive on the CPU; they live where the
// bucket does.
void move_to(std::map<int64_t, torch::Tensor>& memory, int64_t index, const torch::Device& device) {
  auto found = memory.find(index);
  if (found != memory.end() && found->second.device() != device) found->second = found->second.to(device);
}

// The rows x rest view PowerSGD compresses a gradient as.
torch::Tensor as_matrix(const torch::Tensor& gradient) { return gradient.view({gradient.size(0), -1}); }

// Adds the error feedback of `index` to `input` (creating it at zero the
// first time) and returns a copy of the result, as PyTorch's hooks do. The
// copy lives in `copies` from one step to the next: a fresh bucket-sized
// tensor each step costs page faults on every element.
torch::Tensor apply_error_feedback(std::map<int64_t, torch::Tensor>& error, std::map<int64_t, torch::Tensor>& copies,
                                   int64_t index, torch::Tensor& input, const std::string& hook) {
  auto found = error.find(index);
  if (found != error.end()) {
    LOCKSTEP_CHECK(found->second.numel() == input.numel(), hook, ": bucket ", index, " holds ", input.numel(),
                   " elements but its error feedback ", found->second.numel(),
                   " (the buckets changed after PowerSGD started; start_powerSGD_iter must be > 1)");
    input.add_(found->second);
  } else {
    logger().info("A zero tensor of length {} that represents local error is created.", input.numel());
    error[index] = torch::zeros({input.numel()}, input.options());
  }
  torch::Tensor& copy = copies[index];
  if (!copy.defined() || copy.numel() != input.numel()) copy = torch::empty_like(input);
  copy.copy_(input);
  return copy;
}

// Which gradients of a bucket are worth compressing: a matrix whose rank-r
// factors hold fewer numbers by min_compression_rate is; scalars and the
// rest are all-reduced as they are.
struct CompressionPlan {
  std::vector<torch::Tensor> to_compress;  // rows x rest matrices
  std::vector<torch::Tensor> uncompressed;
  int64_t total_p = 0;
  int64_t total_q = 0;
  int64_t elements_before = 0;  // for the compression stats
  int64_t elements_after = 0;
};

CompressionPlan plan_compression(const std::vector<torch::Tensor>& gradients, const PowerSGDOptions& options) {
  CompressionPlan plan;
  for (const torch::Tensor& gradient : gradients) {
    if (gradient.dim() == 0) {  // a scalar: nothing to compress
      plan.uncompressed.push_back(gradient);
      plan.elements_before += 1;
      plan.elements_after += 1;
      continue;
    }
    torch::Tensor matrix = as_matrix(gradient);
    const int64_t n = matrix.size(0);
    const int64_t m = matrix.size(1);
    const int64_t rank = std::min({n, m, options.matrix_approximation_rank()});
    const int64_t uncompressed_size = n * m;
    const int64_t compressed_size = (n + m) * rank;
    plan.elements_before += uncompressed_size;
    if (static_cast<double>(compressed_size) * options.min_compression_rate() < static_cast<double>(uncompressed_size)) {
      plan.to_compress.push_back(matrix);
      plan.total_p += n * rank;
      plan.total_q += m * rank;
      plan.elements_after += compressed_size;
    } else {
      plan.uncompressed.push_back(gradient);
      plan.elements_after += uncompressed_size;
    }
  }
  return plan;
}

// One batch of matrices of one shape that PowerSGD compresses together.
struct LowRankBatch {
  torch::Tensor matrices;                // B x n x m; a view into the bucket unless stacked
  std::vector<torch::Tensor> originals;  // where a stacked batch goes back to
  torch::Tensor p;
  torch::Tensor q;
};

// Matrices of one shape, in the order each shape first appears (PyTorch's
// dict of shapes), each alone or stacked into one batch; their P and Q are
// consecutive views into `p_memory` and `q_memory`.
std::vector<LowRankBatch> low_rank_batches(const std::vector<torch::Tensor>& to_compress, const torch::Tensor& p_memory,
                                           const torch::Tensor& q_memory, const PowerSGDOptions& options) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<torch::Tensor>>> by_shape;
  for (const auto& matrix : to_compress) {
    auto sizes = matrix.sizes().vec();
    auto found = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto& entry) { return entry.first == sizes; });
    if (found == by_shape.end()) {
      by_shape.push_back({sizes, {matrix}});
    } else {
      found->second.push_back(matrix);
    }
  }
  std::vector<LowRankBatch> batches;
  int64_t p_offset = 0;
  int64_t q_offset = 0;
  auto add_batch = [&](torch::Tensor matrices, std::vector<torch::Tensor> originals) {
    const int64_t count = matrices.size(0);
    const int64_t n = matrices.size(1);
    const int64_t m = matrices.size(2);
    const int64_t rank = std::min({n, m, options.matrix_approximation_rank()});
    LowRankBatch batch{matrices, std::move(originals),
                       p_memory.narrow(0, p_offset, count * n * rank).view({count, n, rank}),
                       q_memory.narrow(0, q_offset, count * m * rank).view({count, m, rank})};
    p_offset += count * n * rank;
    q_offset += count * m * rank;
    batches.push_back(std::move(batch));
  };
  for (auto& [shape, matrices] : by_shape) {
    if (options.batch_tensors_with_same_shape() && matrices.size() > 1) {
      add_batch(torch::stack(matrices), matrices);
    } else {
      for (const auto& matrix : matrices) add_batch(matrix.unsqueeze(0), {});
    }
  }
  return batches;
}

// The all-reduced uncompressed gradients, averaged, back into the bucket.
void copy_back_uncompressed(std::vector<torch::Tensor>& uncompressed, torch::Tensor& uncompressed_memory,
                            int64_t world) {
  uncompressed_memory.div_(world);
  int64_t offset = 0;
  for (auto& gradient : uncompressed) {
    gradient.copy_(uncompressed_memory.narrow(0, offset, gradient.numel()).view_as(gradient));
    offset += gradient.numel();
  }
}

// Once P is all-reduced: P orthogonalised, Q = M^T P all-reduced and
// averaged, M = P Q^T written back into the bucket (a stacked batch into its
// originals).
void decompress(std::vector<LowRankBatch>& batches, ProcessGroup& group, torch::Tensor& q_memory, int64_t world,
                double epsilon) {
  for (auto& batch : batches) orthogonalize(batch.p, epsilon);
  for (auto& batch : batches) at::bmm_out(batch.q, batch.matrices.transpose(1, 2), batch.p);
  group.all_reduce(q_memory, ReduceOp::kSum);
  q_memory.div_(world);
  for (auto& batch : batches) at::bmm_out(batch.matrices, batch.p, batch.q.transpose(1, 2));
  for (auto& batch : batches) {
    for (size_t i = 0; i < batch.originals.size(); ++i) batch.originals[i].copy_(batch.matrices[static_cast<int64_t>(i)]);
  }
}

}  // namespace

std::unique_ptr<PendingReduction> PowerSGDHook::run(ProcessGroup& group, const GradBucket& bucket) {
  if (iter_ < options_.start_powerSGD_iter()) return plain_all_reduce(group, bucket);
  log_config_once();
  const int64_t world = group.size();
  const int64_t index = static_cast<int64_t>(bucket.index());
  torch::Tensor input = bucket.buffer();
  for (auto* memory : {&error_, &p_memory_, &q_memory_}) move_to(*memory, index, input.device());
  const auto tensor_options = input.options();
  torch::Tensor input_copy;
  if (options_.use_error_feedback()) input_copy = apply_error_feedback(error_, copies_, index, input, name());

  CompressionPlan plan = plan_compression(bucket.gradients(), options_);
  total_before_ += plan.elements_before;
  total_after_ += plan.elements_after;
  report_compression_stats(bucket);
  std::vector<torch::Tensor> flat;
  for (const auto& gradient : plan.uncompressed) flat.push_back(gradient.reshape({-1}));
  torch::Tensor uncompressed_memory = flat.empty() ? torch::empty({0}, tensor_options) : torch::cat(flat);

  bool randomize_q = false;
  if (!options_.warm_start() || p_memory_.count(index) == 0) {
    randomize_q = true;
    if (options_.warm_start()) {
      logger().info("Allocating contiguous memory of length {} for Ps, and of length {} for Qs, respectively.",
                    plan.total_p, plan.total_q);
    }
    p_memory_[index] = torch::empty({plan.total_p}, tensor_options);
    q_memory_[index] = torch::empty({plan.total_q}, tensor_options);
  }
  torch::Tensor p_memory = p_memory_[index];
  torch::Tensor q_memory = q_memory_[index];
  auto batches =
      std::make_shared<std::vector<LowRankBatch>>(low_rank_batches(plan.to_compress, p_memory, q_memory, options_));
  if (!randomize_q) {
    for (auto& batch : *batches) orthogonalize(batch.q, options_.orthogonalization_epsilon());
  } else {
    at::Generator generator = next_q_generator();
    for (auto& batch : *batches) {
      batch.q.copy_(torch::randn(batch.q.sizes(), generator, torch::TensorOptions().dtype(input.scalar_type())));
      orthogonalize(batch.q, options_.orthogonalization_epsilon());
    }
  }
  for (auto& batch : *batches) at::bmm_out(batch.p, batch.matrices, batch.q);

  // PyTorch issues P's all_reduce once the uncompressed one is done; neither
  // depends on the other, so both start now, in that order.
  auto uncompressed_work = group.all_reduce(uncompressed_memory, ReduceOp::kSum, /*async=*/true);
  auto p_work = group.all_reduce(p_memory, ReduceOp::kSum, /*async=*/true);
  ProcessGroup* reduce_group = &group;
  return std::make_unique<PendingReduction>([this, reduce_group, world, index, input, input_copy,
                                             uncompressed = std::move(plan.uncompressed), uncompressed_memory,
                                             uncompressed_work, p_work, q_memory, batches,
                                             bucket]() mutable -> torch::Tensor {
    uncompressed_work->wait();
    copy_back_uncompressed(uncompressed, uncompressed_memory, world);
    p_work->wait();
    decompress(*batches, *reduce_group, q_memory, world, options_.orthogonalization_epsilon());
    if (options_.use_error_feedback()) at::sub_out(error_[index], input_copy, input);
    if (!options_.warm_start()) {
      p_memory_.clear();
      q_memory_.clear();
    }
    maybe_increase_iter(bucket);
    return torch::Tensor();
  });
}

std::unique_ptr<PendingReduction> BatchedPowerSGDHook::run(ProcessGroup& group, const GradBucket& bucket) {
  if (iter_ < options_.start_powerSGD_iter()) return plain_all_reduce(group, bucket);
  log_config_once();
  const int64_t world = group.size();
  const int64_t index = static_cast<int64_t>(bucket.index());
  const int64_t rank = options_.matrix_approximation_rank();
  torch::Tensor input = bucket.buffer();
  for (auto* memory : {&error_, &p_memory_, &q_memory_}) move_to(*memory, index, input.device());
  const int64_t total = input.numel();
  total_before_ += total;
  const auto side = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(total))));
  total_after_ += side * rank * 2;
  LOCKSTEP_CHECK(side >= rank, name(), ": bucket ", index, " has ", total, " elements, a ", side, " x ", side,
                 " matrix, too small for matrix_approximation_rank ", rank);
  // PyTorch resizes the bucket to side^2 with zeros at the end; a padded copy
  // holds the same numbers without touching DDP's buffer.
  torch::Tensor& padded = padded_[index];
  if (!padded.defined() || padded.numel() != side * side) padded = torch::empty({side * side}, input.options());
  padded.narrow(0, 0, total).copy_(input);
  padded.narrow(0, total, side * side - total).zero_();
  report_compression_stats(bucket);
  torch::Tensor padded_copy;
  if (options_.use_error_feedback()) padded_copy = apply_error_feedback(error_, copies_, index, padded, name());
  torch::Tensor matrix = padded.view({side, side});
  if (!options_.warm_start() || p_memory_.count(index) == 0) {
    if (options_.warm_start()) {
      logger().info("Initializing low-rank tensors P and Q, each of which has a shape of {} x {}.", side, rank);
    }
    p_memory_[index] = torch::empty({side, rank}, input.options());
    at::Generator generator = next_q_generator();
    q_memory_[index] =
        torch::randn({side, rank}, generator, torch::TensorOptions().dtype(input.scalar_type())).to(input.device());
  }
  torch::Tensor p = p_memory_[index];
  torch::Tensor q = q_memory_[index];
  // PyTorch 1.13 hands _orthogonalize the 2-D matrix, which fails its own
  // assertion (it takes batches); here it is a batch of one. Its batched hook
  // orthogonalises without orthogonalization_epsilon, and so does this one.
  orthogonalize(q.unsqueeze(0));
  at::matmul_out(p, matrix, q);
  auto p_work = group.all_reduce(p, ReduceOp::kSum, /*async=*/true);
  ProcessGroup* reduce_group = &group;
  return std::make_unique<PendingReduction>(
      [this, reduce_group, world, index, input, total, padded, padded_copy, matrix, p, q, p_work, bucket]() mutable {
        p_work->wait();
        orthogonalize(p.unsqueeze(0));
        at::matmul_out(q, matrix.t(), p);
        reduce_group->all_reduce(q, ReduceOp::kSum);
        q.div_(world);
        at::matmul_out(matrix, p, q.t());
        if (options_.use_error_feedback()) at::sub_out(error_[index], padded_copy, padded);
        if (!options_.warm_start()) {
          p_memory_.clear();
          q_memory_.clear();
        }
        input.copy_(padded.narrow(0, 0, total));
        maybe_increase_iter(bucket);
        return torch::Tensor();
      });
}

LOCKSTEP_REGISTER(comm_hook_registry(), "PowerSGD", [](const Config& config) {
  return std::make_shared<PowerSGDHook>(parse_powersgd_options(config));
});
LOCKSTEP_REGISTER(comm_hook_registry(), "BatchedPowerSGD", [](const Config& config) {
  return std::make_shared<BatchedPowerSGDHook>(parse_powersgd_options(config));
});

}  // namespace lockstep
