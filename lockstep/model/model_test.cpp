#include "lockstep/model/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "lockstep/core/error.h"
#include "lockstep/model/data_preprocessor.h"

namespace lockstep {
namespace {

TEST(ParseLossesTest, SumsLossKeysAndLogsEverything) {
  LossDict losses;
  losses.insert("loss_cls", torch::tensor(1.5, torch::requires_grad()));
  losses.insert("loss_box", torch::tensor({1.0, 3.0}, torch::requires_grad()));  // mean 2
  losses.insert("accuracy", torch::tensor(0.25));
  ParsedLosses parsed = parse_losses(losses);
  EXPECT_DOUBLE_EQ(parsed.loss.item<double>(), 3.5);
  EXPECT_TRUE(parsed.loss.requires_grad());
  EXPECT_EQ(parsed.log_vars, (LogVars{{"loss_cls", 1.5}, {"loss_box", 2.0}, {"accuracy", 0.25}, {"loss", 3.5}}));
}

TEST(ParseLossesTest, OnTheDeviceTheValuesWaitForOneReadThatGivesWhatItemGives) {
  LossDict losses;
  losses.insert("loss_cls", torch::tensor(0.1f, torch::requires_grad()));
  losses.insert("loss_box", torch::tensor({1.0f, 3.3f}, torch::requires_grad()));
  losses.insert("accuracy", torch::tensor(0.7f));
  const ParsedLosses eager = parse_losses(losses);
  LogValuesOnDevice on_device;
  EXPECT_EQ(LogValuesOnDevice::current(), &on_device);
  const ParsedLosses deferred = parse_losses(losses, &on_device);
  EXPECT_TRUE(deferred.log_vars.empty()) << "nothing read inside the step";
  EXPECT_TRUE(torch::equal(deferred.loss, eager.loss));
  EXPECT_EQ(on_device.tensors().size(), 4u);
  LogVars read;
  on_device.read_into(read);
  EXPECT_EQ(read, eager.log_vars) << "the same doubles as .item<double>() of each float32 value";
  {
    LogValuesOnDevice inner;
    EXPECT_EQ(LogValuesOnDevice::current(), &inner);
  }
  EXPECT_EQ(LogValuesOnDevice::current(), &on_device);
}

TEST(ParseLossesTest, NoLossEntryIsAnError) {
  LossDict losses;
  losses.insert("accuracy", torch::tensor(0.25));
  EXPECT_THROW(parse_losses(losses), Error);
}

TEST(DataPreprocessorTest, NormalisesPerChannelAsFloat) {
  ImgDataPreprocessor preprocessor({10, 20}, {2, 4});
  Batch batch{{"image", torch::tensor({12, 28}, torch::kUInt8).view({1, 2, 1, 1})}, {"label", torch::tensor({1})}};
  Batch out = preprocessor(batch, true);
  EXPECT_EQ(out.at("image").scalar_type(), torch::kFloat);
  EXPECT_FLOAT_EQ(out.at("image")[0][0][0][0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(out.at("image")[0][1][0][0].item<float>(), 2.0f);
  EXPECT_TRUE(torch::equal(out.at("label"), batch.at("label")));
  EXPECT_THROW(ImgDataPreprocessor({1}, {0}), Error);
  ImgDataPreprocessor three({1, 2, 3}, {1, 1, 1});
  EXPECT_THROW(three(batch, true), Error);
}

// A model with one parameter, for where batches go.
struct OneLinear : Model {
  OneLinear() { register_module("fc", fc); }
  LossDict loss(const Batch& data) override {
    LossDict losses;
    losses.insert("loss", fc(data.at("image").flatten(1)).sum());
    return losses;
  }
  Batch predict(const Batch& data) override { return Batch{{"logits", fc(data.at("image").flatten(1))}}; }
  torch::nn::Linear fc{4, 2};
};

// A Trainer built in C++ around a model on a GPU (bench/trainer_overhead's
// construction: a preprocessor set to the device, handed to the model, then
// model->to(device)) sent every batch to the CPU: the preprocessor kept the
// device it had when it was handed over. Now every Module::to moves it too.
// A CPU-only libtorch 1.13 cannot move a module anywhere but the CPU, so the
// preprocessor is pointed elsewhere (the meta device) and each way of moving
// the model must bring it back to the module's device.
TEST(ModelDevice, TheBatchFollowsTheModuleWhereverItIsMoved) {
  auto model = std::make_shared<OneLinear>();
  auto preprocessor = std::make_shared<ImgDataPreprocessor>(std::vector<double>{72.94}, std::vector<double>{90.02});
  preprocessor->set_device(torch::kMeta);
  model->set_data_preprocessor(preprocessor);  // takes the model's device
  EXPECT_EQ(model->device(), torch::Device(torch::kCPU));
  Batch batch{{"image", torch::ones({3, 1, 2, 2}, torch::kUInt8)}, {"label", torch::zeros({3}, torch::kLong)}};
  auto batch_device = [&] { return model->data_preprocessor()(batch, true).at("image").device(); };

  preprocessor->set_device(torch::kMeta);
  model->to(torch::kCPU);  // torch::nn::Module::to, as a C++ user writes it
  EXPECT_EQ(model->device(), torch::Device(torch::kCPU));
  EXPECT_EQ(batch_device(), torch::Device(torch::kCPU));

  preprocessor->set_device(torch::kMeta);
  std::shared_ptr<torch::nn::Module> as_module = model;
  as_module->to(torch::kCPU, torch::kDouble);  // through the base class, with a dtype
  EXPECT_EQ(model->device(), torch::Device(torch::kCPU));
  EXPECT_EQ(model->fc->weight.scalar_type(), torch::kDouble);

  preprocessor->set_device(torch::kMeta);
  model->move_to(torch::kCPU);
  EXPECT_EQ(model->device(), torch::Device(torch::kCPU));
}

TEST(BatchTest, NamedAccessSliceAndConcat) {
  Batch batch{{"x", torch::arange(6).view({3, 2})}, {"y", torch::arange(3)}};
  EXPECT_EQ(batch.size(), 3);
  EXPECT_EQ(batch.names(), (std::vector<std::string>{"x", "y"}));
  Batch part = batch.slice(1, 2);
  EXPECT_TRUE(torch::equal(part.at("y"), torch::tensor({1, 2})));
  Batch joined = Batch::concat({batch.slice(0, 1), part});
  EXPECT_TRUE(torch::equal(joined.at("x"), batch.at("x")));
  try {
    batch.at("z");
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("x, y"), std::string::npos);
  }
}

// model.frozen_parameters: a module's name freezes every parameter inside it,
// a parameter's name that one; the rest still train. A name that matches
// nothing is an error naming the key's line and the model's parameters.
TEST(FrozenParameters, NamesFreezeParametersAndModules) {
  auto model = build_model(parse_config(
      "type: ConvNet\nchannels: [4]\nhidden: 8\nbatch_norm: false\nfrozen_parameters: [features.0, head.1.bias]\n", "model.yaml"));
  std::map<std::string, bool> trains;
  for (const auto& item : model->named_parameters()) trains[item.key()] = item.value().requires_grad();
  EXPECT_FALSE(trains.at("features.0.weight"));
  EXPECT_FALSE(trains.at("features.0.bias"));
  EXPECT_FALSE(trains.at("head.1.bias"));
  EXPECT_TRUE(trains.at("head.1.weight"));
  EXPECT_TRUE(trains.at("head.3.weight"));
  try {
    build_model(parse_config("type: ConvNet\nchannels: [4]\nhidden: 8\nbatch_norm: false\nfrozen_parameters: [features.9]\n", "model.yaml"));
    FAIL() << "an unknown name was accepted";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), ::testing::AllOf(::testing::HasSubstr("model.yaml:5"), ::testing::HasSubstr("features.9"),
                                               ::testing::HasSubstr("head.1.weight")));
  }
}

}  // namespace
}  // namespace lockstep
