// PowerSGD gradient compression (Vogels et al., 2019) as DDP comm hooks,
// step for step PyTorch's powerSGD_hook and batched_powerSGD_hook
// (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py).
//
// PowerSGDHook compresses each gradient matrix M (a parameter's gradient seen
// as rows x rest) to rank r: P = M Q, all_reduce P, orthogonalise P,
// Q = M^T P, all_reduce Q, M ~ P Q^T / N. Vectors and matrices too small to
// gain min_compression_rate are all-reduced as they are, in one batch. Error
// feedback adds what the last approximation left out; warm start reuses Q.
// For the first start_powerSGD_iter iterations it all-reduces plainly.
// BatchedPowerSGDHook compresses the whole bucket as one square matrix:
// faster, much less accurate unless the rank is 1 (and, as PyTorch's, it
// ignores orthogonalization_epsilon).
//
// Same options, same arithmetic, same random initial Q (numpy's
// RandomState(random_seed).randint(1e9) seeds torch's generator) and so the
// same bits as PyTorch on the same libtorch. The state (iteration, error
// feedback, P and Q, the random generator) goes into checkpoints.
//
//   model_wrapper:
//     comm_hook: {type: PowerSGD, matrix_approximation_rank: 4, start_powerSGD_iter: 10}
//
//   ddp.register_comm_hook(std::make_shared<lockstep::PowerSGDHook>(
//       lockstep::PowerSGDOptions().matrix_approximation_rank(4).start_powerSGD_iter(10)));
#pragma once

#include <map>
#include <memory>
#include <random>
#include <string>

#include <torch/torch.h>

#include "lockstep/config/config.h"
#include "lockstep/parallel/ddp/comm_hook.h"

namespace lockstep {

// PyTorch's PowerSGDState arguments, with its defaults.
struct PowerSGDOptions {
  TORCH_ARG(int64_t, matrix_approximation_rank) = 1;
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  TORCH_ARG(double, min_compression_rate) = 2;
  TORCH_ARG(bool, use_error_feedback) = true;
  TORCH_ARG(bool, warm_start) = true;
  TORCH_ARG(double, orthogonalization_epsilon) = 0;
  TORCH_ARG(int64_t, random_seed) = 0;
  TORCH_ARG(int64_t, compression_stats_logging_frequency) = 10000;
  TORCH_ARG(bool, batch_tensors_with_same_shape) = false;
};

// Reads the keys above from a comm_hook config map (unknown keys are errors).
PowerSGDOptions parse_powersgd_options(const Config& config);

// numpy's legacy RandomState(seed).randint(high) for 0 < high <= 2^32, the
// draws PowerSGD seeds its random Q with: MT19937 with masked rejection.
class LegacyNumpyRandom {
 public:
  explicit LegacyNumpyRandom(uint32_t seed) : engine_(seed) {}
  int64_t randint(int64_t high);
  std::string save() const;
  void load(const std::string& text);

 private:
  std::mt19937 engine_;
};

// Orthonormalises the columns of each matrix of a batch (B x n x r, r <= n)
// in place, as PyTorch's _orthogonalize: Gram-Schmidt for r <= 2 or half
// precision (adding `epsilon` to each norm), Householder QR otherwise.
void orthogonalize(torch::Tensor matrices, double epsilon = 0);

// What both hooks share: the options, the iteration count, the memories and
// their checkpointing.
class PowerSGDBase : public CommHook {
 public:
  explicit PowerSGDBase(PowerSGDOptions options);
  State state() const override;
  void load_state(const State& state) override;
  // The iteration, the random generator and the warm-start P and Q are the
  // same on every rank and come back; each rank's error feedback cannot be
  // assigned to the new ranks and starts at zero.
  bool load_state_from_other_world_size(const State& rank0) override;
  const PowerSGDOptions& options() const { return options_; }
  int64_t iteration() const { return iter_; }
  // (compression rate, elements before, elements after), as PowerSGDState.compression_stats().
  std::tuple<double, int64_t, int64_t> compression_stats() const;

 protected:
  // PyTorch logs the options when the state is made; here on the first
  // bucket, so that a config checked before the run logs nothing.
  void log_config_once();
  void maybe_increase_iter(const GradBucket& bucket);
  void report_compression_stats(const GradBucket& bucket);
  // The plain all_reduce of the first start_powerSGD_iter iterations.
  std::unique_ptr<PendingReduction> plain_all_reduce(ProcessGroup& group, const GradBucket& bucket);
  // A generator seeded as PyTorch seeds its random Q: torch.manual_seed(rng.randint(1e9)).
  at::Generator next_q_generator();

  PowerSGDOptions options_;
  LegacyNumpyRandom rng_;
  int64_t iter_ = 0;
  int64_t total_before_ = 0;
  int64_t total_after_ = 0;
  int64_t next_stats_report_ = 0;
  bool logged_config_ = false;
  std::map<int64_t, torch::Tensor> error_;     // by bucket index
  std::map<int64_t, torch::Tensor> p_memory_;
  std::map<int64_t, torch::Tensor> q_memory_;
  // Scratch kept between steps (not state): the pre-compression copy and, for
  // the batched hook, the padded square matrix.
  std::map<int64_t, torch::Tensor> copies_;
  std::map<int64_t, torch::Tensor> padded_;
};

class PowerSGDHook : public PowerSGDBase {
 public:
  explicit PowerSGDHook(PowerSGDOptions options = PowerSGDOptions()) : PowerSGDBase(options) {}
  std::unique_ptr<PendingReduction> run(ProcessGroup& group, const GradBucket& bucket) override;
  std::string name() const override { return "PowerSGD"; }
};

class BatchedPowerSGDHook : public PowerSGDBase {
 public:
  explicit BatchedPowerSGDHook(PowerSGDOptions options = PowerSGDOptions()) : PowerSGDBase(options) {}
  std::unique_ptr<PendingReduction> run(ProcessGroup& group, const GradBucket& bucket) override;
  std::string name() const override { return "BatchedPowerSGD"; }
};

}  // namespace lockstep
