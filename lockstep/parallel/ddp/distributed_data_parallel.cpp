#include "lockstep/parallel/ddp/distributed_data_parallel.h"

#include <torch/csrc/utils/tensor_flatten.h>

#include <atomic>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "lockstep/compat/autograd.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/shape_text.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/hierarchy.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/process_group.h"

namespace lockstep {
std::vector<std::pair<std::string, torch::Tensor>> unique_trainable_parameters(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> unique;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    unique.emplace_back(item.key(), p);
  }
  return unique;
}

DDPOptions parse_ddp_options(const Config& config, const DDPOptions& defaults) {
  DDPOptions options = defaults;
  if (config.is_null()) return options;
  options.bucket_cap_mb(config.get<double>("bucket_cap_mb", defaults.bucket_cap_mb()))
      .first_bucket_cap_mb(config.get<double>("first_bucket_cap_mb", defaults.first_bucket_cap_mb()))
      .gradient_as_bucket_view(config.get<bool>("gradient_as_bucket_view", defaults.gradient_as_bucket_view()))
      .find_unused_parameters(config.get<bool>("find_unused_parameters", defaults.find_unused_parameters()))
      .static_graph(config.get<bool>("static_graph", defaults.static_graph()))
      .broadcast_buffers(config.get<bool>("broadcast_buffers", defaults.broadcast_buffers()))
      .detect_anomalous_params(config.get<bool>("detect_anomalous_params", defaults.detect_anomalous_params()))
      .ranks_per_node(config.get<int>("ranks_per_node", defaults.ranks_per_node()))
      .hierarchical_all_reduce(parse_hierarchical_mode(config, defaults.hierarchical_all_reduce()));
  LOCKSTEP_CHECK(options.ranks_per_node() >= 0, config.where("ranks_per_node"),
                 ": ranks_per_node must be 0 (from the launcher) or positive");
  LOCKSTEP_CHECK(options.bucket_cap_mb() > 0, config.where("bucket_cap_mb"), ": bucket_cap_mb must be positive");
  LOCKSTEP_CHECK(options.first_bucket_cap_mb() > 0, config.where("first_bucket_cap_mb"),
                 ": first_bucket_cap_mb must be positive");
  return options;
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group, DDPOptions options)
    : module_(std::move(module)), options_(options) {
  LOCKSTEP_CHECK(module_ != nullptr, "DistributedDataParallel needs a module");
  if (!group) group = world();
  LOCKSTEP_CHECK(group != nullptr, "DistributedDataParallel needs an initialised process group "
                 "(call lockstep::init_from_env() or init_process_group() first)");
  // Its gradients go over the group's own connections, in the group's order
  // (Note [One mesh per process]): backward issues them on the thread that
  // issues the group's other collectives.
  group_ = group->view(group->name() + "." + next_group_name("ddp"));

  for (auto& [name, param] : unique_trainable_parameters(*module_)) {
    names_.push_back(name);
    params_.push_back(param);
  }
  std::unordered_set<const void*> seen;
  for (const auto& buffer : module_->buffers(/*recurse=*/true)) {
    if (seen.insert(buffer.unsafeGetTensorImpl()).second) buffers_.push_back(buffer);
  }
  verify_same_model_on_every_rank();
  set_up_hierarchy();
  // Every rank starts from rank 0's weights.
  std::vector<torch::Tensor> state;
  for (const auto& item : module_->named_parameters(true)) state.push_back(item.value());
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_from_rank0(state);

  const auto mib = [](double mb) { return static_cast<int64_t>(mb * 1024 * 1024); };
  reducer_ = std::make_unique<Reducer>(params_, names_, group_,
                                       ReducerOptions()
                                           .first_bucket_bytes(mib(options_.first_bucket_cap_mb()))
                                           .bucket_bytes(mib(options_.bucket_cap_mb()))
                                           .gradient_as_bucket_view(options_.gradient_as_bucket_view())
                                           .find_unused_parameters(options_.find_unused_parameters())
                                           .static_graph(options_.static_graph()));
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::set_up_hierarchy() {
  configure_hierarchical_all_reduce(*group_, options_.hierarchical_all_reduce(), options_.ranks_per_node(), "DDP");
}

bool DistributedDataParallel::hierarchical() const { return group_->hierarchical_all_reduce(); }

void DistributedDataParallel::verify_same_model_on_every_rank() {
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& item : module_->named_parameters(true)) {
    mine.push_back({item.key(), c10::toString(item.value().scalar_type()), item.value().sizes().vec(),
                    item.value().requires_grad()});
  }
  std::vector<nlohmann::json> all = all_gather_object(mine, group_);
  const auto& reference = all.front();
  for (int r = 1; r < group_->size(); ++r) {
    const auto& other = all[static_cast<size_t>(r)];
    const int rank = group_->global_rank(r);
    const int rank0 = group_->global_rank(0);
    for (size_t i = 0; i < std::min(reference.size(), other.size()); ++i) {
      const auto& a = reference[i];
      const auto& b = other[i];
      LOCKSTEP_CHECK(a[0] == b[0], "DDP: ranks hold different models: parameter #", i, " is '",
                     a[0].get<std::string>(), "' on rank ", rank0, " but '", b[0].get<std::string>(), "' on rank ", rank);
      const std::string name = a[0].get<std::string>();
      LOCKSTEP_CHECK(a[2] == b[2], "DDP: parameter '", name, "' has shape ",
                     shape_text(a[2].get<std::vector<int64_t>>()), " on rank ", rank0, " but ",
                     shape_text(b[2].get<std::vector<int64_t>>()), " on rank ", rank);
      LOCKSTEP_CHECK(a[1] == b[1], "DDP: parameter '", name, "' has dtype ", a[1].get<std::string>(), " on rank ", rank0,
                     " but ", b[1].get<std::string>(), " on rank ", rank);
      LOCKSTEP_CHECK(a[3] == b[3], "DDP: parameter '", name, "' requires grad on one of ranks ", rank0, " and ", rank,
                     " but not on the other");
    }
    LOCKSTEP_CHECK(reference.size() == other.size(), "DDP: rank ", rank0, " has ", reference.size(),
                   " parameters but rank ", rank, " has ", other.size(), " (first extra: '",
                   (reference.size() > other.size() ? reference : other)[std::min(reference.size(), other.size())][0]
                       .get<std::string>(),
                   "')");
  }
}

void DistributedDataParallel::broadcast_from_rank0(std::vector<torch::Tensor> tensors) {
  if (group_->size() == 1 || tensors.empty()) return;
  torch::NoGradGuard no_grad;
  // One broadcast per dtype/device (coalesced), not one per tensor.
  std::map<std::string, std::vector<torch::Tensor>> by_type;
  for (auto& t : tensors) by_type[std::string(c10::toString(t.scalar_type())) + t.device().str()].push_back(t);
  for (auto& [key, group] : by_type) {
    torch::Tensor flat = torch::utils::flatten_dense_tensors(group);
    group_->broadcast(flat, 0);
    auto parts = torch::utils::unflatten_dense_tensors(flat, group);
    for (size_t i = 0; i < group.size(); ++i) group[i].copy_(parts[i]);
  }
}

void DistributedDataParallel::begin_forward(bool sync) {
  LOCKSTEP_CHECK(!forward_awaits_backward_, "DDP on rank ", get_rank(), ": a new forward pass started while the "
                 "previous synchronised forward never ran backward. Every rank must run backward after each "
                 "synchronised forward (otherwise ranks fall out of step); use no_sync / accumulation for "
                 "forward passes without a reduction.");
  reducer_->prepare_for_forward();
  if (options_.broadcast_buffers()) broadcast_from_rank0(buffers_);
  forward_awaits_backward_ = sync && no_sync_depth_ == 0;
}

void DistributedDataParallel::enter_no_sync() {
  if (no_sync_depth_++ == 0) reducer_->set_local_accumulation_allowed(true);
}

void DistributedDataParallel::leave_no_sync() {
  if (--no_sync_depth_ == 0) reducer_->set_local_accumulation_allowed(false);
}

std::vector<std::string> DistributedDataParallel::parameters_outside_graph(const torch::Tensor& loss) const {
  std::unordered_set<const torch::autograd::Node*> graph;
  for (const auto* node : compat::reachable_nodes(loss)) graph.insert(node);
  std::vector<std::string> outside;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (graph.count(compat::grad_accumulator(params_[i]).get()) == 0) outside.push_back(names_[i]);
  }
  return outside;
}

void DistributedDataParallel::begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration) {
  forward_awaits_backward_ = false;
  if (options_.detect_anomalous_params()) {
    auto outside = parameters_outside_graph(loss);
    for (const auto& name : outside) {
      logger().error("{} with shape {} is not in the computational graph of the loss (unused in forward, or "
                     "not used to produce the loss)", name, shape_text(module_->named_parameters()[name].sizes()));
    }
  }
  reducer_->prepare_for_backward(loss, sync && no_sync_depth_ == 0, iteration);
}

void DistributedDataParallel::end_backward(bool /*sync*/) { reducer_->finish_backward(); }

void DistributedDataParallel::step_failed(const std::exception_ptr& error, bool reduced, bool sync,
                                          int64_t iteration) {
  const bool forward_began = forward_awaits_backward_;
  forward_awaits_backward_ = false;
  if (reduced) {
    reducer_->mark_diverged(iteration, describe_exception(error));
    return;
  }
  // A pass in flight is completed with zeros; a failure between a
  // synchronised forward and its backward starts the pass the other ranks are
  // in. Before any forward, this rank cannot know which collectives the
  // others run next (a model need not use optim_context), so it does not
  // guess: the next backward's iteration check names the rank out of step
  // (Note [The iteration check]).
  reducer_->abandon(error, /*start_pass=*/forward_began && sync && no_sync_depth_ == 0, iteration);
}

State DistributedDataParallel::state() const {
  State state;
  const auto order = reducer_->rebuilt_order();
  if (!order.empty()) state.values["bucket_order"] = order;
  if (auto hook = reducer_->comm_hook()) {
    State mine = hook->state();
    if (!mine.empty()) state.put("comm_hook", gather_hook_state(hook->name(), std::move(mine)));
  }
  return state;
}

State DistributedDataParallel::gather_hook_state(const std::string& hook_name, State mine) const {
  // Values are rank 0's; tensors are every rank's, as "rank<r>/<name>",
  // sent to rank 0 (which writes the checkpoint) one at a time.
  nlohmann::json layout = nlohmann::json::array();
  for (const auto& [name, tensor] : mine.tensors) {
    layout.push_back({name, tensor.sizes().vec(), std::string(c10::toString(tensor.scalar_type()))});
  }
  auto all_layouts = all_gather_object(layout, group_);
  for (int r = 1; r < group_->size(); ++r) {
    LOCKSTEP_CHECK(all_layouts[static_cast<size_t>(r)] == all_layouts.front(), "DDP: comm hook '", hook_name,
                   "' holds different state on rank ", group_->global_rank(0), " (", all_layouts.front().dump(),
                   ") and rank ", group_->global_rank(r), " (", all_layouts[static_cast<size_t>(r)].dump(), ")");
  }
  State gathered;
  gathered.values = mine.values;
  gathered.values["hook"] = hook_name;
  gathered.values["world_size"] = group_->size();
  const std::string own = "rank" + std::to_string(group_->rank()) + "/";
  for (auto& [name, tensor] : mine.tensors) {
    torch::Tensor local = tensor.contiguous();
    gathered.tensors[own + name] = local;
    if (group_->rank() != 0) {
      group_->send(local, 0);
      continue;
    }
    for (int r = 1; r < group_->size(); ++r) {
      torch::Tensor received = torch::empty_like(local);
      group_->recv(received, r);
      gathered.tensors["rank" + std::to_string(r) + "/" + name] = received;
    }
  }
  return gathered;
}

void DistributedDataParallel::load_state(const State& state) {
  if (state.values.contains("bucket_order")) {
    reducer_->restore_rebuilt_order(state.values["bucket_order"].get<std::vector<int64_t>>());
  }
  auto hook = reducer_->comm_hook();
  if (!hook || !state.contains("comm_hook")) return;
  State saved = state.get("comm_hook");
  const std::string saved_name = saved.values.value("hook", std::string());
  const int saved_world = saved.values.value("world_size", 0);
  if (saved_name != hook->name()) {
    logger().warn("DDP: the checkpoint holds the state of comm hook '{}', this run uses '{}': it starts afresh",
                  saved_name, hook->name());
    return;
  }
  State mine;
  mine.values = saved.values;
  mine.values.erase("hook");
  mine.values.erase("world_size");
  if (saved_world != group_->size()) {
    for (const auto& [name, tensor] : saved.tensors) {
      if (name.rfind("rank0/", 0) == 0) mine.tensors[name.substr(6)] = tensor;
    }
    const bool kept = hook->load_state_from_other_world_size(mine);
    logger().warn("DDP: comm hook '{}' saved its state on {} ranks and resumes on {}: {}", saved_name, saved_world,
                  group_->size(), kept ? "what every rank shares comes back, each rank's own part starts afresh"
                                       : "it starts afresh");
    return;
  }
  const std::string prefix = "rank" + std::to_string(group_->rank()) + "/";
  for (const auto& [name, tensor] : saved.tensors) {
    if (name.rfind(prefix, 0) == 0) mine.tensors[name.substr(prefix.size())] = tensor;
  }
  hook->load_state(mine);
}

void DistributedDataParallel::register_comm_hook(std::shared_ptr<CommHook> hook) { reducer_->set_comm_hook(std::move(hook)); }

}  // namespace lockstep
