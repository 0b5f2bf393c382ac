// A DCGAN for 28x28 grayscale images (Fashion-MNIST), written as a user of
// lockstep would: a Model with two child networks ("generator",
// "discriminator") updated in turns by two optimizers, a dataset wrapper that
// attaches the latent noise to each batch, and a hook that writes a PNG grid
// of samples every N iterations. examples/gan/main.cpp trains it from
// gan.yaml; tests/gan runs the same config for a few iterations.
//
//   dcgan::register_components();   // "DCGAN", "WithLatentNoise", "GanSampleGrid"
//   lockstep::Runner runner(lockstep::load_config("examples/gan/gan.yaml"));
//   runner.train();                  // <work_dir>/samples_0000200.png, ...
//
// Noise comes with the data, drawn from the loader's per-batch seed (which
// differs by rank, epoch and batch), not from the global generator: every
// rank sees its own noise and a resumed run draws exactly the noise an
// uninterrupted one would, without any per-rank random state to checkpoint.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "lockstep/builtin_models/linear.h"
#include "lockstep/core/error.h"
#include "lockstep/core/png.h"
#include "lockstep/data/dataset.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/model/model.h"
#include "lockstep/strategy/strategy.h"

namespace dcgan {

struct DCGANOptions {
  TORCH_ARG(int64_t, latent_dim) = 64;
  // Feature maps of the generator at 14x14 (twice as many at 7x7).
  TORCH_ARG(int64_t, generator_channels) = 64;
  // Feature maps of the discriminator at 14x14 (twice as many at 7x7).
  TORCH_ARG(int64_t, discriminator_channels) = 64;
};

// Radford et al.'s recipe at 28x28: transposed convolutions with BatchNorm
// and ReLU up from a 7x7 map, tanh output; the discriminator mirrors it with
// strided convolutions and LeakyReLU(0.2) and ends in one logit.
class DCGAN : public lockstep::Model {
 public:
  explicit DCGAN(const DCGANOptions& options = DCGANOptions()) : options_(options) {
    namespace nn = torch::nn;
    const int64_t g = options.generator_channels();
    const int64_t d = options.discriminator_channels();
    generator = register_module(
        "generator",
        nn::Sequential(lockstep::Linear(nn::LinearOptions(options.latent_dim(), 2 * g * 7 * 7).bias(false)),
                       nn::Unflatten(nn::UnflattenOptions(1, {2 * g, 7, 7})), nn::BatchNorm2d(2 * g), nn::ReLU(),
                       nn::ConvTranspose2d(nn::ConvTranspose2dOptions(2 * g, g, 4).stride(2).padding(1).bias(false)),
                       nn::BatchNorm2d(g), nn::ReLU(),
                       nn::ConvTranspose2d(nn::ConvTranspose2dOptions(g, 1, 4).stride(2).padding(1)), nn::Tanh()));
    discriminator = register_module(
        "discriminator",
        nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, d, 4).stride(2).padding(1)),
                       nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                       nn::Conv2d(nn::Conv2dOptions(d, 2 * d, 4).stride(2).padding(1).bias(false)),
                       nn::BatchNorm2d(2 * d), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                       nn::Flatten(), lockstep::Linear(2 * d * 7 * 7, 1)));
    // DCGAN's initialisation: N(0, 0.02) weights, BatchNorm scales N(1, 0.02).
    torch::NoGradGuard no_grad;
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* bn = module->as<nn::BatchNorm2d>()) {
        bn->weight.normal_(1.0, 0.02);
        bn->bias.zero_();
      } else if (module->as<nn::Conv2d>() || module->as<nn::ConvTranspose2d>() || module->as<nn::Linear>()) {
        for (auto& param : module->named_parameters(/*recurse=*/false)) {
          if (param.key() == "weight") param.value().normal_(0.0, 0.02);
          if (param.key() == "bias") param.value().zero_();
        }
      }
    }
  }

  int64_t latent_dim() const { return options_.latent_dim(); }

  // Images in [-1, 1] from noise [N, latent_dim].
  torch::Tensor sample(const torch::Tensor& noise) { return generator->forward(noise); }

  // One discriminator update on real and generated images, then one generator
  // update through the (frozen) discriminator; each network is synchronised
  // by its own DDP under separate DDP.
  lockstep::LogVars train_step(const lockstep::Batch& batch, lockstep::OptimWrapperDict& optim) override {
    lockstep::Batch data = data_preprocessor()(batch, /*training=*/true);
    const torch::Tensor real = data.at("image");
    const torch::Tensor noise = data.at("noise");
    lockstep::LogVars log_vars;

    lockstep::OptimWrapper& d_optim = optim["discriminator"];
    torch::Tensor d_loss;
    {
      auto context = d_optim.optim_context();
      torch::Tensor fake;
      {
        torch::NoGradGuard no_grad;  // the generator learns nothing from this step
        fake = generator->forward(noise);
      }
      torch::Tensor real_logits = discriminator->forward(real);
      torch::Tensor fake_logits = discriminator->forward(fake);
      d_loss = torch::binary_cross_entropy_with_logits(real_logits, torch::ones_like(real_logits)) +
               torch::binary_cross_entropy_with_logits(fake_logits, torch::zeros_like(fake_logits));
      log_vars["d_real"] = torch::sigmoid(real_logits).mean().item<double>();
      log_vars["d_fake"] = torch::sigmoid(fake_logits).mean().item<double>();
    }
    d_optim.update_params(d_loss);

    lockstep::OptimWrapper& g_optim = optim["generator"];
    set_requires_grad(*discriminator, false);
    torch::Tensor g_loss;
    {
      auto context = g_optim.optim_context();
      torch::Tensor logits = discriminator->forward(generator->forward(noise));
      // The non-saturating loss: the generator wants its images called real.
      g_loss = torch::binary_cross_entropy_with_logits(logits, torch::ones_like(logits));
    }
    g_optim.update_params(g_loss);
    set_requires_grad(*discriminator, true);

    log_vars["loss_d"] = d_loss.item<double>();
    log_vars["loss_g"] = g_loss.item<double>();
    // The trainer stops every rank when "loss" turns non-finite.
    log_vars["loss"] = log_vars["loss_d"] + log_vars["loss_g"];
    return log_vars;
  }

  lockstep::LossDict loss(const lockstep::Batch&) override {
    LOCKSTEP_FAIL("DCGAN trains through its own train_step with two optimizers: configure optim_wrapper with "
                  "'generator' and 'discriminator' entries");
  }
  lockstep::Batch predict(const lockstep::Batch& data) override { return {{"fake", sample(data.at("noise"))}}; }

  torch::nn::Sequential generator{nullptr};
  torch::nn::Sequential discriminator{nullptr};

 private:
  static void set_requires_grad(torch::nn::Module& module, bool flag) {
    for (auto& param : module.parameters()) param.requires_grad_(flag);
  }
  DCGANOptions options_;
};

// Another dataset's batches plus "noise" [N, latent_dim] ~ N(0, 1), drawn
// from the batch's seed (see the file comment).
class WithLatentNoise : public lockstep::Dataset {
 public:
  WithLatentNoise(std::shared_ptr<lockstep::Dataset> inner, int64_t latent_dim)
      : inner_(std::move(inner)), latent_dim_(latent_dim) {
    LOCKSTEP_CHECK(latent_dim_ > 0, "latent_dim must be positive, got ", latent_dim_);
  }
  int64_t size() const override { return inner_->size(); }
  lockstep::Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override {
    lockstep::Batch batch = inner_->get_batch(indices, seed);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x9e3779b97f4a7c15ULL);
    batch.set("noise", at::randn({static_cast<int64_t>(indices.size()), latent_dim_}, generator));
    return batch;
  }

 private:
  std::shared_ptr<lockstep::Dataset> inner_;
  int64_t latent_dim_;
};

// Every `interval` iterations (and at the end) rank 0 draws the generator's
// images for one fixed set of noise vectors, in eval mode, and writes them as
// one grid: <work_dir>/samples_<iterations done, 7 digits>.png. Watching the
// same noise over time shows progress. With `tensorboard: true` the grid also
// goes to the EventStorage as image "samples" (for the TensorBoard writer).
class GanSampleGrid : public lockstep::Hook {
 public:
  GanSampleGrid(std::string work_dir, bool main_process, int64_t interval, int64_t num_samples, int64_t columns,
                uint64_t seed, bool tensorboard)
      : Hook("GanSampleGrid"),
        work_dir_(std::move(work_dir)),
        main_process_(main_process),
        interval_(interval),
        num_samples_(num_samples),
        columns_(columns),
        seed_(seed),
        tensorboard_(tensorboard) {
    LOCKSTEP_CHECK(interval_ >= 1, "GanSampleGrid: interval must be at least 1, got ", interval_);
    LOCKSTEP_CHECK(num_samples_ >= 1 && columns_ >= 1, "GanSampleGrid: num_samples and columns must be positive");
  }

  void after_step() override {
    const int64_t done = trainer().iter() + 1;
    if (done % interval_ == 0) write(done);
  }
  void after_train() override {
    // A failed run leaves its last grid as it was.
    if (trainer().iter() == trainer().max_iter() && last_written_ != trainer().max_iter()) write(trainer().max_iter());
  }

 private:
  void write(int64_t done) {
    last_written_ = done;
    if (!main_process_) return;
    auto* gan = dynamic_cast<DCGAN*>(&trainer().model());
    LOCKSTEP_CHECK(gan != nullptr, "GanSampleGrid needs a DCGAN model");
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed_);
    torch::Tensor noise = at::randn({num_samples_, gan->latent_dim()}, generator).to(gan->device());
    torch::Tensor images;
    {
      torch::NoGradGuard no_grad;
      const bool was_training = gan->generator->is_training();
      gan->generator->eval();
      images = gan->sample(noise);
      gan->generator->train(was_training);
    }
    torch::Tensor grid = lockstep::image_grid((images.to(torch::kCPU) + 1) / 2, columns_, /*padding=*/2,
                                              /*pad_value=*/1.0);
    lockstep::write_png(fmt::format("{}/samples_{:07d}.png", work_dir_, done), grid);
    if (tensorboard_) trainer().storage().put_image("samples", grid);
  }

  std::string work_dir_;
  bool main_process_;
  int64_t interval_, num_samples_, columns_;
  uint64_t seed_;
  bool tensorboard_;
  int64_t last_written_ = -1;
};

// Makes the three names above known to configs (idempotent).
inline void register_components() {
  static const bool registered = [] {
    lockstep::model_registry().add("DCGAN", [](const lockstep::Config& config) {
      return std::make_shared<DCGAN>(DCGANOptions()
                                         .latent_dim(config.get<int64_t>("latent_dim", 64))
                                         .generator_channels(config.get<int64_t>("generator_channels", 64))
                                         .discriminator_channels(config.get<int64_t>("discriminator_channels", 64)));
    });
    lockstep::dataset_registry().add("WithLatentNoise", [](const lockstep::Config& config) {
      return std::make_shared<WithLatentNoise>(lockstep::dataset_registry().build(config.at("dataset")),
                                               config.get<int64_t>("latent_dim"));
    });
    lockstep::hook_registry().add("GanSampleGrid", [](const lockstep::Config& config,
                                                      const lockstep::HookContext& context) {
      return std::make_shared<GanSampleGrid>(
          context.work_dir, context.strategy->collectives()->is_main_process(), config.get<int64_t>("interval", 200),
          config.get<int64_t>("num_samples", 64), config.get<int64_t>("columns", 8),
          static_cast<uint64_t>(config.get<int64_t>("seed", 0)), config.get<bool>("tensorboard", false));
    });
    return true;
  }();
  (void)registered;
}

}  // namespace dcgan
