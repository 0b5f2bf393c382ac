// A Trainer on a tiny model and synthetic images, for the hooks' unit tests.
//
//   lockstep::testing::TrainerRig rig(std::make_shared<lockstep::MLP>(lockstep::MLPOptions().in_features(16)),
//                                     /*examples=*/16, /*side=*/4);
//   rig.trainer->register_hooks({hook});
//   rig.trainer->train(0, 8);
#pragma once

#include <memory>
#include <string>

#include <torch/torch.h>

#include "lockstep/data/data_loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/data/synthetic.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/builtin_models/classifiers.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep::testing {

struct TrainerRig {
  // `model` reads 1 x side x side images (raw 0..255 values); batches of 4,
  // in order; SGD with `lr`.
  TrainerRig(std::shared_ptr<Model> model_in, int64_t examples, int64_t side, double lr = 0.01) : model(std::move(model_in)) {
    model->set_data_preprocessor(std::make_shared<ImgDataPreprocessor>(std::vector<double>{}, std::vector<double>{}));
    auto data = std::make_shared<SyntheticImages>(SyntheticImagesOptions().size(examples).height(side).width(side));
    auto loader = std::make_shared<DataLoader>(data, std::make_shared<SequentialSampler>(examples),
                                               DataLoaderOptions().batch_size(4));
    strategy = std::make_shared<SingleDeviceStrategy>();
    strategy->prepare(model, parse_config("optimizer: {type: SGD, lr: " + std::to_string(lr) + "}"), Config(),
                      SchedulerContext{examples / 4, 100});
    trainer = std::make_unique<Trainer>(strategy->model(), loader, strategy->optim_wrapper());
  }
  std::shared_ptr<Model> model;
  std::shared_ptr<SingleDeviceStrategy> strategy;
  std::unique_ptr<Trainer> trainer;
};

// A seeded MLP for 1 x side x side images.
inline std::shared_ptr<MLP> tiny_mlp(int64_t side, int64_t hidden) {
  torch::manual_seed(0);
  return std::make_shared<MLP>(MLPOptions().in_features(side * side).hidden({hidden}));
}

}  // namespace lockstep::testing
