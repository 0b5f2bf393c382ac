// DistributedDataParallel: the same model on every rank, gradients averaged
// across ranks while backward still runs.
//
// Construction checks that every rank holds the same parameters (names,
// shapes, dtypes; a mismatch names the parameter and the ranks) and copies
// rank 0's parameters and buffers to all. Then a Reducer (reducer.h) hooks
// every parameter: gradients are bucketed and all-reduced asynchronously, in
// bucket order, as soon as autograd produces them. The reasons behind the
// reducer's choices are Notes in its files:
//   - reducer_buckets.cpp: Note [Bucket order and rebuild], Note [Gradients as bucket views];
//   - reducer.cpp: Note [Dividing by the world size], Note [Unused parameters get no gradient],
//     Note [Dropping a failed step];
//   - iteration_check.cpp: Note [The iteration check].
//
// It plugs into the OptimWrapper as its GradientSync, so the model keeps its
// own train_step and accumulation micro-steps skip communication:
//
//   lockstep::init_from_env();
//   auto ddp = std::make_shared<lockstep::DistributedDataParallel>(model, lockstep::world(),
//       lockstep::DDPOptions().find_unused_parameters(true));
//   optim_wrapper->set_gradient_sync(ddp);      // DDPStrategy does this
//   model->train_step(batch, *optim_wrapper);   // unchanged user code
//
// Without an OptimWrapper, call the GradientSync methods around backward:
//   ddp->begin_forward(true); auto loss = ...; ddp->begin_backward(loss, true, step);
//   loss.backward(); ddp->end_backward(true);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/torch.h>

#include "lockstep/config/config.h"
#include "lockstep/optim/gradient_sync.h"
#include "lockstep/parallel/ddp/comm_hook.h"
#include "lockstep/parallel/ddp/reducer.h"

namespace lockstep {

class ProcessGroup;

struct DDPOptions {
  TORCH_ARG(double, bucket_cap_mb) = 25;
  TORCH_ARG(double, first_bucket_cap_mb) = 1;
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  TORCH_ARG(bool, find_unused_parameters) = false;
  TORCH_ARG(bool, static_graph) = false;
  // Copy rank 0's buffers (BatchNorm statistics) to every rank before each forward.
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Log the parameters that are not in the loss's graph (mmengine's debugging aid).
  TORCH_ARG(bool, detect_anomalous_params) = false;
  // "auto": reduce buckets hierarchically (within each node, then across the
  // nodes' first ranks, then within each node again; see
  // ProcessGroup::enable_hierarchical_all_reduce) when the group spans more
  // than one node and some node runs more than one rank. "on" insists (an
  // error when the launcher does not say which node each rank is on); "off"
  // keeps the flat all_reduce.
  TORCH_ARG(std::string, hierarchical_all_reduce) = "auto";
  // Which ranks share a node: 0 takes it from the launcher (GROUP_RANK,
  // SLURM_NODEID); N > 0 treats each N consecutive ranks as one node.
  TORCH_ARG(int, ranks_per_node) = 0;
};

// Reads bucket_cap_mb, first_bucket_cap_mb, gradient_as_bucket_view,
// find_unused_parameters, static_graph, broadcast_buffers,
// detect_anomalous_params, hierarchical_all_reduce (auto | true | false),
// ranks_per_node.
DDPOptions parse_ddp_options(const Config& config, const DDPOptions& defaults = DDPOptions());

class DistributedDataParallel : public GradientSync {
 public:
  // `group` null: the world group.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group = nullptr,
                          DDPOptions options = DDPOptions());
  ~DistributedDataParallel() override;

  void begin_forward(bool sync) override;
  void begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration) override;
  void end_backward(bool sync) override;
  // Before the reduction (after a synchronised forward, or inside backward):
  // the step is dropped on every rank (Reducer::abandon); after it: the next
  // backward fails on every rank (Reducer::mark_diverged).
  void step_failed(const std::exception_ptr& error, bool reduced, bool sync, int64_t iteration) override;
  // The rebuilt bucket order (see Reducer::rebuilt_order) and the comm hook's
  // state, every rank's (a hook's state may differ between ranks: PowerSGD's
  // error feedback does). Collective: every rank calls it. The bucket order
  // lets a resumed run sum as the uninterrupted one (Note [Bucket order and rebuild]).
  State state() const override;
  void load_state(const State& state) override;

  // Skips gradient communication while alive (accumulate locally); the next
  // synchronised backward reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel* ddp) : ddp_(ddp) { ddp_->enter_no_sync(); }
    ~NoSync() { ddp_->leave_no_sync(); }
    C10_DISABLE_COPY_AND_ASSIGN(NoSync);

   private:
    DistributedDataParallel* ddp_;
  };
  [[nodiscard]] std::unique_ptr<NoSync> no_sync() { return std::make_unique<NoSync>(this); }

  // Before the first backward; see comm_hook.h. Its state is part of state().
  void register_comm_hook(std::shared_ptr<CommHook> hook);
  // Whether buckets are reduced hierarchically (see DDPOptions).
  bool hierarchical() const;
  torch::nn::Module& module() const { return *module_; }
  Reducer& reducer() const { return *reducer_; }
  const DDPOptions& options() const { return options_; }
  // The group DDP reduces on (its own copy of the given group's ranks, so its
  // collectives never interleave with the model's own, e.g. SyncBatchNorm's).
  ProcessGroup& process_group() const { return *group_; }
  // Names of the parameters outside the graph of `loss` (detect_anomalous_params).
  std::vector<std::string> parameters_outside_graph(const torch::Tensor& loss) const;

 private:
  void verify_same_model_on_every_rank();
  void set_up_hierarchy();
  State gather_hook_state(const std::string& hook_name, State mine) const;
  void broadcast_from_rank0(std::vector<torch::Tensor> tensors);

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> buffers_;
  std::unique_ptr<Reducer> reducer_;
  void enter_no_sync();
  void leave_no_sync();

  int no_sync_depth_ = 0;
  bool forward_awaits_backward_ = false;
};

// The parameters of `module` that require grad, each once (tied parameters
// appear under their first name), in registration order.
std::vector<std::pair<std::string, torch::Tensor>> unique_trainable_parameters(const torch::nn::Module& module);

}  // namespace lockstep
