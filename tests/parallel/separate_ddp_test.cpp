// Separate DDP for a two-network, two-optimizer model (a tiny GAN): each
// network is synchronised by its own DDP and updated by its own optimizer, in
// the order the model's train_step decides.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/model/model.h"
#include "lockstep/parallel/separate_ddp.h"
#include "tests/parallel/ddp_models.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

// Generator: noise(4) -> 8 features; discriminator: 8 features -> 1 logit.
struct TinyGan : Model {
  TinyGan() {
    generator = register_module("generator", torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::Tanh(),
                                                                   torch::nn::Linear(16, 8)));
    discriminator = register_module("discriminator", torch::nn::Sequential(torch::nn::Linear(8, 16),
                                                                           torch::nn::LeakyReLU(), torch::nn::Linear(16, 1)));
  }
  LossDict loss(const Batch&) override { LOCKSTEP_FAIL("TinyGan trains through its own train_step"); }
  Batch predict(const Batch& data) override { return {{"fake", generator->forward(data.at("noise"))}}; }

  static void set_requires_grad(torch::nn::Module& module, bool flag) {
    for (auto& p : module.parameters()) p.requires_grad_(flag);
  }

  // One discriminator update, then one generator update (the usual GAN turn).
  LogVars train_step(const Batch& batch, OptimWrapperDict& optim) override {
    LogVars log_vars;
    if (hook_between) hook_between("before_d");
    {
      OptimWrapper& d_optim = optim["discriminator"];
      torch::Tensor d_loss;
      {
        auto context = d_optim.optim_context();
        torch::Tensor fake = generator->forward(batch.at("noise")).detach();
        torch::Tensor real_logits = discriminator->forward(batch.at("real"));
        torch::Tensor fake_logits = discriminator->forward(fake);
        d_loss = torch::binary_cross_entropy_with_logits(real_logits, torch::ones_like(real_logits)) +
                 torch::binary_cross_entropy_with_logits(fake_logits, torch::zeros_like(fake_logits));
      }
      d_optim.update_params(d_loss);
      log_vars["loss_d"] = d_loss.item<double>();
    }
    if (hook_between) hook_between("between");
    {
      OptimWrapper& g_optim = optim["generator"];
      set_requires_grad(*discriminator, false);
      torch::Tensor g_loss;
      {
        auto context = g_optim.optim_context();
        torch::Tensor logits = discriminator->forward(generator->forward(batch.at("noise")));
        g_loss = torch::binary_cross_entropy_with_logits(logits, torch::ones_like(logits));
      }
      g_optim.update_params(g_loss);
      set_requires_grad(*discriminator, true);
      log_vars["loss_g"] = g_loss.item<double>();
    }
    if (hook_between) hook_between("after_g");
    return log_vars;
  }
  torch::nn::Sequential generator{nullptr}, discriminator{nullptr};
  std::function<void(const std::string&)> hook_between;
};

std::shared_ptr<OptimWrapperDict> make_optim(TinyGan& gan) {
  auto dict = std::make_shared<OptimWrapperDict>();
  dict->add("generator", std::make_shared<OptimWrapper>(std::make_shared<torch::optim::Adam>(
                             gan.generator->parameters(), torch::optim::AdamOptions(1e-2).betas({0.5, 0.999}))));
  dict->add("discriminator", std::make_shared<OptimWrapper>(std::make_shared<torch::optim::SGD>(
                                 gan.discriminator->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9))));
  dict->initialize_count_status(0, 10);
  return dict;
}

Batch gan_batch(int64_t size, uint64_t seed) {
  torch::manual_seed(seed);
  return Batch{{"real", torch::randn({size, 8}) * 0.5 + 1.0}, {"noise", torch::randn({size, 4})}};
}

LOCKSTEP_WORKER_TEST(SeparateDdpWorker, MatchesOneProcessWithTheWholeBatch) {
  testing::WorkerWorld world_guard;
  const int64_t per_rank = 5;
  torch::manual_seed(11);
  auto gan = std::make_shared<TinyGan>();
  torch::manual_seed(11);
  auto reference = std::make_shared<TinyGan>();
  auto separate = std::make_shared<SeparateDistributedDataParallel>(gan, world());
  EXPECT_EQ(separate->children().size(), 2u);
  auto optim = make_optim(*gan);
  separate->attach(*optim);
  auto reference_optim = make_optim(*reference);
  for (int64_t step = 0; step < 10; ++step) {
    Batch batch = gan_batch(per_rank * get_world_size(), static_cast<uint64_t>(200 + step));
    gan->run_train_step(batch.slice(get_rank() * per_rank, per_rank), *optim, {step, {}});
    reference->train_step(batch, *reference_optim);
  }
  testing::expect_same_state(*gan, *reference, 1e-5, 1e-6);
}

LOCKSTEP_WORKER_TEST(SeparateDdpWorker, EachStepTouchesOnlyItsOwnNetwork) {
  testing::WorkerWorld world_guard;
  torch::manual_seed(3);
  auto gan = std::make_shared<TinyGan>();
  auto separate = std::make_shared<SeparateDistributedDataParallel>(gan, world());
  auto optim = make_optim(*gan);
  separate->attach(*optim);
  auto snapshot = [](torch::nn::Module& module) {
    std::vector<torch::Tensor> values;
    for (auto& p : module.parameters()) {
      values.push_back(p.detach().clone());
      values.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    }
    return values;
  };
  auto expect_unchanged = [](const std::vector<torch::Tensor>& before, const std::vector<torch::Tensor>& after,
                             const std::string& what) {
    ASSERT_EQ(before.size(), after.size());
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_EQ(before[i].defined(), after[i].defined()) << what << " #" << i;
      if (before[i].defined() && after[i].defined()) EXPECT_TRUE(torch::equal(before[i], after[i])) << what << " #" << i;
    }
  };
  std::vector<torch::Tensor> g_before, d_before;
  gan->hook_between = [&](const std::string& point) {
    if (point == "before_d") g_before = snapshot(*gan->generator);
    if (point == "between") {
      expect_unchanged(g_before, snapshot(*gan->generator), "generator after the discriminator step");
      d_before = snapshot(*gan->discriminator);
    }
    if (point == "after_g") expect_unchanged(d_before, snapshot(*gan->discriminator), "discriminator after the generator step");
  };
  for (int64_t step = 0; step < 3; ++step) {
    gan->run_train_step(gan_batch(6, static_cast<uint64_t>(step)).slice(get_rank() * 3, 3), *optim, {step, {}});
  }
}

TEST(SeparateDdp, TwoNetworksTwoOptimizers) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::expect_each_worker_ok(2, {"SeparateDdpWorker.MatchesOneProcessWithTheWholeBatch",
                                     "SeparateDdpWorker.EachStepTouchesOnlyItsOwnNetwork"});
}

}  // namespace
}  // namespace lockstep
