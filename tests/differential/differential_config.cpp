#include "tests/differential/differential_config.h"

#include <gtest/gtest.h>

#include <sstream>

namespace lockstep::differential {

using nlohmann::json;

bool on_gpu(const json& c) { return c.value("device", std::string("cpu")) == "cuda"; }

namespace {

std::string yaml_list(const json& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + values[i].dump();
  return text + "]";
}

// examples/gan's DCGAN (two networks, an Adam per network) in the YAML of examples/gan/gan.yaml.
std::string gan_config(const json& c, const std::string& strategy, const std::string& init) {
  std::ostringstream yaml;
  const json& model = c["model"];
  const json& opt = c["optimizer"];
  const std::string optimizer = "{optimizer: {type: Adam, lr: " + opt["lr"].dump() + ", betas: " +
                                yaml_list(opt["betas"]) + "}}";
  yaml << "randomness: {seed: " << c["seed"] << "}\n"
       << "env: {num_threads: 1}\n"
       << "model: {type: DCGAN, latent_dim: " << model["latent_dim"] << ", generator_channels: "
       << model["generator_channels"] << ", discriminator_channels: " << model["discriminator_channels"]
       << ", data_preprocessor: {type: ImgDataPreprocessor, mean: [127.5], std: [127.5]}}\n"
       << "train_dataloader:\n  batch_size: " << c["batch"]
       << "\n  num_workers: 0\n  sampler: {type: DefaultSampler, shuffle: false}\n"
       << "  dataset: {type: WithLatentNoise, latent_dim: " << model["latent_dim"]
       << ", dataset: {type: FashionMNIST, root: /usr/share/datasets/fashion-mnist, split: train}}\n"
       << "train_cfg: {max_iters: " << c["iters"] << "}\n"
       << "optim_wrapper: {generator: " << optimizer << ", discriminator: " << optimizer << "}\n"
       << "default_hooks:\n  logger: {interval: 5}\n  checkpoint: {interval: " << c["iters"] << ", by_epoch: false}\n"
       << "load_from: " << init << "\n"
       << strategy;
  return yaml.str();
}

}  // namespace

std::string lockstep_config(const json& c, const std::string& strategy, const std::string& init) {
  if (c["model"]["type"] == "DCGAN") return gan_config(c, strategy, init);
  std::ostringstream yaml;
  const json& model = c["model"];
  yaml << "randomness: {seed: " << c["seed"] << (on_gpu(c) ? ", deterministic: true" : "") << "}\n"
       << "env: {num_threads: 1}\n";
  if (model["type"] == "ScriptedConvNet") {
    // The module pytorch_reference.py scripted, beside the initial weights.
    yaml << "model:\n  type: TorchScriptModel\n  path: " << init.substr(0, init.rfind(".safetensors"))
         << ".scripted.pt\n";
  } else {
    yaml << "model:\n  type: ConvNet\n  channels: " << yaml_list(model["channels"]) << "\n  hidden: " << model["hidden"]
         << "\n  batch_norm: " << model["batch_norm"] << "\n";
  }
  if (model.contains("memory_format")) yaml << "  memory_format: " << model["memory_format"].get<std::string>() << "\n";
  if (c.contains("frozen")) yaml << "  frozen_parameters: " << yaml_list(c["frozen"]) << "\n";
  if (c.contains("frozen_dtype")) yaml << "  frozen_dtype: " << c["frozen_dtype"].get<std::string>() << "\n";
  yaml << "  data_preprocessor: {type: ImgDataPreprocessor, mean: [72.94], std: [90.02]}\n"
       << "train_dataloader:\n  batch_size: " << c["batch"]
       << "\n  num_workers: 0\n  sampler: {type: DefaultSampler, shuffle: false}\n"
       << "  dataset: {type: FashionMNIST, root: /usr/share/datasets/fashion-mnist, split: train}\n"
       << "train_cfg: {max_iters: " << c["iters"] << "}\n";
  const json& opt = c["optimizer"];
  yaml << "optim_wrapper:\n  optimizer: {type: " << opt["type"].get<std::string>() << ", lr: " << opt["lr"];
  for (const char* key :
       {"momentum", "weight_decay", "nesterov", "eps", "lr_decay", "initial_accumulator_value", "capturable", "foreach"}) {
    if (opt.contains(key)) yaml << ", " << key << ": " << opt[key];
  }
  if (opt.contains("betas")) yaml << ", betas: " << yaml_list(opt["betas"]);
  yaml << "}\n";
  if (c.contains("paramwise")) yaml << "  paramwise_cfg: " << c["paramwise"].dump() << "\n";
  if (c["accumulate"] != 1) yaml << "  accumulative_counts: " << c["accumulate"] << "\n";
  if (!c["clip"].is_null()) {
    yaml << "  clip_grad: {max_norm: " << c["clip"]["max_norm"] << ", norm_type: " << c["clip"]["norm_type"];
    if (c["clip"].contains("type")) yaml << ", type: " << c["clip"]["type"].get<std::string>();
    if (c["clip"].contains("foreach")) yaml << ", foreach: " << c["clip"]["foreach"];
    yaml << "}\n";
  }
  if (!c["amp"].is_null()) {
    yaml << "  amp: {dtype: " << c["amp"].get<std::string>();
    if (c.contains("loss_scale")) yaml << ", loss_scale: " << c["loss_scale"].dump();
    yaml << "}\n";
  }
  if (!c["schedulers"].empty()) {
    yaml << "param_scheduler:\n";
    for (const json& s : c["schedulers"]) {
      const std::string type = s["type"];
      if (type == "LinearLR") {
        // mmengine's LinearLR reaches end_factor at step end - 1 (total_iters = end - begin - 1),
        // torch's at step total_iters.
        yaml << "  - {type: LinearLR, by_epoch: false, start_factor: " << s["start_factor"]
             << ", end_factor: " << s.value("end_factor", 1.0) << ", begin: 0, end: "
             << s["total_iters"].get<int>() + 1 << "}\n";
      } else if (type == "MultiStepLR") {
        yaml << "  - {type: MultiStepLR, by_epoch: false, milestones: " << yaml_list(s["milestones"])
             << ", gamma: " << s["gamma"] << ", begin: 0, end: " << c["iters"] << "}\n";
      } else if (type == "CosineAnnealingLR") {
        yaml << "  - {type: CosineAnnealingLR, by_epoch: false, T_max: " << s["T_max"]
             << ", eta_min: " << s["eta_min"] << ", begin: 0, end: " << c["iters"] << "}\n";
      } else {
        ADD_FAILURE() << "no lockstep form for scheduler " << type;
      }
    }
  }
  yaml << "default_hooks:\n  logger: {interval: 5}\n  checkpoint: {interval: " << c["iters"] << ", by_epoch: false}\n"
       << "load_from: " << init << "\n"
       << strategy;
  return yaml.str();
}


std::string pinned_to_cpu(const std::string& strategy) {
  const std::string flow = "strategy: {", block = "strategy:\n";
  if (strategy.rfind(flow, 0) == 0) return flow + "device: cpu, " + strategy.substr(flow.size());
  EXPECT_EQ(strategy.rfind(block, 0), 0u) << "a strategy the suite cannot pin: " << strategy;
  return block + "  device: cpu\n" + strategy.substr(block.size());
}

}  // namespace lockstep::differential
