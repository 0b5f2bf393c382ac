#include "lockstep/model/activation_checkpoint.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <map>
#include <mutex>
#include <optional>

#include "lockstep/compat/autocast.h"
#include "lockstep/compat/autograd.h"
#include "lockstep/compat/cuda.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// The random number generators a recomputation must replay.
struct GeneratorStates {
  at::Tensor cpu;
  std::vector<std::pair<int, at::Tensor>> cuda;  // device index, state

  static GeneratorStates capture(const std::vector<torch::Tensor>& inputs) {
    GeneratorStates states;
    {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      states.cpu = generator.get_state();
    }
    std::vector<int> devices;
    for (const auto& input : inputs) {
      if (input.defined() && input.is_cuda() &&
          std::find(devices.begin(), devices.end(), input.get_device()) == devices.end()) {
        devices.push_back(input.get_device());
      }
    }
    for (int device : devices) {
      at::Generator generator = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, device));
      std::lock_guard<std::mutex> lock(generator.mutex());
      states.cuda.emplace_back(device, generator.get_state());
    }
    return states;
  }

  void restore() const {
    {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(cpu);
    }
    for (const auto& [device, state] : cuda) {
      at::Generator generator = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, device));
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
  }
};

struct AutocastSettings {
  bool cpu_enabled, cuda_enabled;
  c10::ScalarType cpu_dtype, cuda_dtype;

  static AutocastSettings capture() {
    return {compat::autocast_enabled(c10::DeviceType::CPU), compat::autocast_enabled(c10::DeviceType::CUDA),
            compat::autocast_dtype(c10::DeviceType::CPU), compat::autocast_dtype(c10::DeviceType::CUDA)};
  }
  void apply() const {
    compat::set_autocast_enabled(c10::DeviceType::CPU, cpu_enabled);
    compat::set_autocast_enabled(c10::DeviceType::CUDA, cuda_enabled);
    compat::set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
    compat::set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
  }
};

// The backward of a checkpointed call: runs the function again with grad
// enabled and the forward's generator and autocast state, then
// backpropagates the incoming gradients through it (a reentrant backward).
struct CheckpointBackward : public torch::autograd::Node {
  CheckpointFunction fn;
  std::vector<torch::Tensor> inputs;  // detached
  std::vector<bool> input_requires_grad;
  std::vector<int64_t> input_versions;  // at forward, as save_for_backward checks
  GeneratorStates generators;
  AutocastSettings autocast;
  std::vector<bool> output_differentiable;

  std::string name() const override { return "lockstep::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    LOCKSTEP_CHECK(!inputs.empty() || fn, "activation checkpoint: backward ran twice (retain_graph is not supported)");
    for (size_t i = 0; i < inputs.size(); ++i) {
      LOCKSTEP_CHECK(!inputs[i].defined() || inputs[i]._version() == input_versions[i], "activation checkpoint: input ",
                     i, " of a checkpointed function was modified in place after the forward (its version is ",
                     inputs[i]._version(), ", was ", input_versions[i],
                     "); the recomputation would see other values. Clone it before modifying it.");
    }
    std::vector<torch::Tensor> leaves;
    leaves.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      torch::Tensor leaf = inputs[i].defined() ? inputs[i].detach() : inputs[i];
      if (leaf.defined() && input_requires_grad[i]) leaf.requires_grad_(true);
      leaves.push_back(leaf);
    }
    // Recompute with the forward's random state and autocast, then put ours back.
    const GeneratorStates now = GeneratorStates::capture(inputs);
    const AutocastSettings autocast_now = AutocastSettings::capture();
    std::vector<torch::Tensor> outputs;
    {
      try {
        generators.restore();
        autocast.apply();
        torch::AutoGradMode grad_mode(true);
        outputs = fn(leaves);
      } catch (...) {
        now.restore();
        autocast_now.apply();
        throw;
      }
      now.restore();
      autocast_now.apply();
    }
    LOCKSTEP_CHECK(outputs.size() == output_differentiable.size(), "activation checkpoint: the recomputation returned ",
                   outputs.size(), " tensors, the forward ", output_differentiable.size());
    // One incoming gradient per differentiable output, in output order.
    std::vector<torch::Tensor> roots, root_grads;
    size_t next_grad = 0;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!output_differentiable[i]) continue;
      const torch::Tensor& grad = grads.at(next_grad++);
      if (grad.defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    torch::autograd::variable_list input_grads;
    for (size_t i = 0; i < leaves.size(); ++i) {
      input_grads.push_back(leaves[i].defined() && input_requires_grad[i] ? leaves[i].grad() : torch::Tensor());
    }
    // Free what the graph held.
    inputs.clear();
    fn = nullptr;
    return input_grads;
  }

  void release_variables() override {
    inputs.clear();
    fn = nullptr;
  }
};

struct Marks {
  std::mutex mutex;
  // module address -> (weak reference, asked)
  std::map<const torch::nn::Module*, std::pair<std::weak_ptr<torch::nn::Module>, bool>> modules;
};

Marks& marks() {
  static Marks instance;
  return instance;
}

}  // namespace


bool is_checkpoint_node(const torch::autograd::Node& node) {
  return dynamic_cast<const CheckpointBackward*>(&node) != nullptr;
}

std::vector<torch::Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<torch::Tensor>& inputs) {
  LOCKSTEP_CHECK(fn != nullptr, "checkpoint: no function");
  // Without grad mode (evaluation) there is nothing to save: just run it.
  // With it, even inputs that need no gradient go through the checkpoint:
  // the parameters inside fn need theirs.
  if (!torch::GradMode::is_enabled()) return fn(inputs);

  auto node = compat::make_node<CheckpointBackward>();
  node->fn = fn;
  node->generators = GeneratorStates::capture(inputs);
  node->autocast = AutocastSettings::capture();
  for (const auto& input : inputs) {
    node->inputs.push_back(input.defined() ? input.detach() : input);
    node->input_requires_grad.push_back(input.defined() && input.requires_grad());
    node->input_versions.push_back(input.defined() ? input._version() : 0);
  }
  std::vector<torch::Tensor> outputs;
  {
    torch::NoGradGuard no_grad;
    outputs = fn(node->inputs);
  }
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  for (auto& output : outputs) {
    const bool differentiable = output.defined() && output.is_floating_point();
    node->output_differentiable.push_back(differentiable);
    if (!differentiable) continue;
    // An output that is an input (or a view of one) gets its own storage, so
    // the gradient edge belongs to the output alone.
    bool aliases_input = output.is_view();
    for (const auto& input : node->inputs) aliases_input |= input.defined() && output.is_same(input);
    if (aliases_input) output = output.clone();
    torch::autograd::create_gradient_edge(output, node);
  }
  return outputs;
}

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input) {
  // fn runs again in backward, after this call returned: held by value.
  return checkpoint([fn](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{fn(in[0])}; },
                    {input})[0];
}

void enable_activation_checkpointing(const std::shared_ptr<torch::nn::Module>& module) {
  LOCKSTEP_CHECK(module != nullptr, "enable_activation_checkpointing: no module");
  std::lock_guard<std::mutex> lock(marks().mutex);
  marks().modules[module.get()] = {module, false};
}

bool activation_checkpointing_enabled(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(marks().mutex);
  auto found = marks().modules.find(&module);
  if (found == marks().modules.end()) return false;
  auto alive = found->second.first.lock();
  if (alive.get() != &module) {  // a dead module's address, reused
    marks().modules.erase(found);
    return false;
  }
  found->second.second = true;
  return true;
}

torch::Tensor checkpointed(const torch::nn::Module& module, const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                           const torch::Tensor& input) {
  if (!activation_checkpointing_enabled(module)) return fn(input);
  return checkpoint(fn, input);
}

bool module_type_matches(const std::string& name, const std::string& wanted) {
  auto matches_one = [&](const std::string& candidate) {
    if (name == candidate) return true;
    const std::string tail = "::" + candidate;
    return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return matches_one(wanted) || matches_one(wanted + "Impl");
}

std::vector<std::string> apply_activation_checkpointing(torch::nn::Module& root, const std::vector<std::string>& type_names) {
  LOCKSTEP_CHECK(!type_names.empty(), "activation checkpointing: module_types is empty");
  std::vector<std::string> paths;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    for (const auto& wanted : type_names) {
      if (module_type_matches(item.value()->name(), wanted)) {
        enable_activation_checkpointing(item.value());
        paths.push_back(item.key());
        break;
      }
    }
  }
  if (paths.empty()) {
    std::string wanted, present;
    for (const auto& name : type_names) wanted += (wanted.empty() ? "" : ", ") + name;
    std::vector<std::string> seen;
    for (const auto& item : root.named_modules("", false)) {
      if (std::find(seen.begin(), seen.end(), item.value()->name()) == seen.end()) seen.push_back(item.value()->name());
    }
    for (const auto& name : seen) present += (present.empty() ? "" : ", ") + name;
    LOCKSTEP_FAIL("activation checkpointing: no module of type ", wanted, " in the model (its module types: ", present, ")");
  }
  return paths;
}

std::vector<std::string> unconsulted_checkpoint_modules(torch::nn::Module& root) {
  std::vector<std::string> paths;
  std::lock_guard<std::mutex> lock(marks().mutex);
  for (const auto& item : root.named_modules("", false)) {
    auto found = marks().modules.find(item.value().get());
    if (found == marks().modules.end()) continue;
    if (found->second.first.lock().get() != item.value().get()) {  // a dead module's address, reused
      marks().modules.erase(found);
      continue;
    }
    if (!found->second.second) paths.push_back(item.key());
  }
  return paths;
}

}  // namespace lockstep
