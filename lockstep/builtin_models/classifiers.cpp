#include "lockstep/builtin_models/classifiers.h"

#include "lockstep/builtin_models/linear.h"

#include "lockstep/core/error.h"

namespace lockstep {

LossDict ImageClassifier::loss(const Batch& data) {
  LossDict losses;
  losses.insert("loss_cls", torch::nn::functional::cross_entropy(forward(data.at("image")), data.at("label")));
  return losses;
}

Batch ImageClassifier::predict(const Batch& data) { return Batch{{"logits", forward(data.at("image"))}}; }

ConvNet::ConvNet(const ConvNetOptions& options) : options_(options) {
  LOCKSTEP_CHECK(!options.channels().empty(), "ConvNet needs at least one conv layer in channels");
  LOCKSTEP_CHECK(options.pooling() == "after_each" || options.pooling() == "after_last",
                 "ConvNet pooling must be after_each or after_last, got '", options.pooling(), "'");
  features_ = torch::nn::Sequential();
  int64_t in = options.in_channels();
  int64_t size = options.image_size();
  const bool pool_each = options.pooling() == "after_each";
  for (int64_t out : options.channels()) {
    LOCKSTEP_CHECK(out > 0, "ConvNet channels must be positive, got ", out);
    // Padded 3x3 convs keep the size when pooling after each; unpadded ones shrink it by 2.
    const int64_t padding = pool_each ? 1 : 0;
    features_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(padding).bias(!options.batch_norm())));
    if (options.batch_norm()) features_->push_back(torch::nn::BatchNorm2d(out));
    features_->push_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
    size -= 2 * (1 - padding);
    if (pool_each) {
      features_->push_back(torch::nn::MaxPool2d(2));
      size /= 2;
    }
    in = out;
  }
  if (!pool_each) {
    features_->push_back(torch::nn::MaxPool2d(2));
    size /= 2;
  }
  LOCKSTEP_CHECK(size >= 1, "ConvNet: image_size ", options.image_size(), " is too small for ",
                 options.channels().size(), " conv layers");
  head_ = torch::nn::Sequential(torch::nn::Flatten(), Linear(in * size * size, options.hidden()),
                                torch::nn::ReLU(torch::nn::ReLUOptions(true)));
  if (options.dropout() > 0) head_->push_back(torch::nn::Dropout(options.dropout()));
  head_->push_back(Linear(options.hidden(), options.num_classes()));
  register_module("features", features_);
  register_module("head", head_);
}

torch::Tensor ConvNet::forward(const torch::Tensor& image) { return head_->forward(features_->forward(image)); }

MLP::MLP(const MLPOptions& options) {
  layers_ = torch::nn::Sequential(torch::nn::Flatten());
  int64_t in = options.in_features();
  for (int64_t width : options.hidden()) {
    LOCKSTEP_CHECK(width > 0, "MLP hidden widths must be positive, got ", width);
    layers_->push_back(Linear(in, width));
    layers_->push_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
    in = width;
  }
  layers_->push_back(Linear(in, options.num_classes()));
  register_module("layers", layers_);
}

torch::Tensor MLP::forward(const torch::Tensor& image) { return layers_->forward(image); }

LOCKSTEP_REGISTER(model_registry(), "ConvNet", [](const Config& config) {
  ConvNetOptions options;
  options.in_channels(config.get<int64_t>("in_channels", 1))
      .image_size(config.get<int64_t>("image_size", 28))
      .channels(config.get<std::vector<int64_t>>("channels", {32, 64}))
      .hidden(config.get<int64_t>("hidden", 128))
      .num_classes(config.get<int64_t>("num_classes", 10))
      .batch_norm(config.get<bool>("batch_norm", true))
      .pooling(config.get<std::string>("pooling", "after_each"))
      .dropout(config.get<double>("dropout", 0.0));
  return std::make_shared<ConvNet>(options);
});

LOCKSTEP_REGISTER(model_registry(), "MLP", [](const Config& config) {
  MLPOptions options;
  options.in_features(config.get<int64_t>("in_features", 784))
      .hidden(config.get<std::vector<int64_t>>("hidden", {256}))
      .num_classes(config.get<int64_t>("num_classes", 10));
  return std::make_shared<MLP>(options);
});

}  // namespace lockstep
