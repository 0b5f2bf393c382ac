#include "lockstep/model/memory_format.h"

#include <gtest/gtest.h>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/model/model.h"

namespace lockstep {
namespace {

const char* const kConvNet =
    "model:\n"
    "  type: ConvNet\n"
    "  channels: [4, 8]\n"
    "  hidden: 16\n"
    "  batch_norm: true\n"
    "  data_preprocessor: {type: ImgDataPreprocessor, mean: [72.94], std: [90.02]}\n";

std::shared_ptr<Model> conv_net(const std::string& extra) {
  torch::manual_seed(3);
  return build_model(parse_config(std::string(kConvNet) + extra, "net.yaml").at("model"));
}

Batch images() {
  torch::manual_seed(4);
  return Batch{{"image", torch::randint(0, 256, {5, 1, 28, 28}, torch::kUInt8)},
               {"label", torch::randint(0, 10, {5}, torch::kLong)}};
}

TEST(MemoryFormat, ChannelsLastRewritesTheRankFourParametersAndTheInputs) {
  auto model = conv_net("  memory_format: channels_last\n");
  int rewritten = 0;
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor& p = item.value();
    if (p.dim() == 4) {
      ++rewritten;
      EXPECT_TRUE(p.is_contiguous(c10::MemoryFormat::ChannelsLast)) << item.key();
      // The first weight has one input channel: contiguous either way, but
      // its strides must say channels-last (Note [Which layout a tensor is in]).
      EXPECT_EQ(p.suggest_memory_format(), c10::MemoryFormat::ChannelsLast) << item.key();
    } else {
      EXPECT_TRUE(p.is_contiguous()) << item.key();
    }
  }
  EXPECT_EQ(rewritten, 2) << "the two convolutions' weights";
  const Batch data = model->data_preprocessor()(images(), /*training=*/true);
  EXPECT_EQ(data.at("image").suggest_memory_format(), c10::MemoryFormat::ChannelsLast) << "grey images too";
  EXPECT_EQ(data.at("label").scalar_type(), torch::kLong) << "integer entries are left as they are";
}

// The same weights in another order compute the same function, and
// autograd's gradients take their parameter's layout (what DDP's bucket
// views alias, Note [Gradients as bucket views]).
TEST(MemoryFormat, TheSameLossAndGradientsInChannelsLastOrder) {
  auto plain = conv_net("");
  auto last = conv_net("  memory_format: channels_last\n");
  const Batch batch = images();
  torch::Tensor loss_plain = plain->loss(plain->data_preprocessor()(batch, true)).begin()->value();
  torch::Tensor loss_last = last->loss(last->data_preprocessor()(batch, true)).begin()->value();
  EXPECT_NEAR(loss_plain.item<double>(), loss_last.item<double>(), 1e-5);
  loss_plain.backward();
  loss_last.backward();
  auto plain_params = plain->named_parameters();
  for (const auto& item : last->named_parameters()) {
    const torch::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    EXPECT_EQ(grad.strides(), item.value().strides()) << item.key();
    EXPECT_TRUE(torch::allclose(grad, plain_params[item.key()].grad(), 1e-4, 1e-6)) << item.key();
  }
  // Converting back, gradients included, restores the plain layout.
  to_memory_format(*last, c10::MemoryFormat::Contiguous);
  for (const auto& item : last->named_parameters()) {
    EXPECT_TRUE(item.value().is_contiguous()) << item.key();
    EXPECT_TRUE(item.value().grad().is_contiguous()) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), plain_params[item.key()])) << item.key();
  }
}

TEST(MemoryFormat, TheInputsFollowAPreprocessorSetLater) {
  auto model = conv_net("  memory_format: channels_last\n");
  model->set_data_preprocessor(std::make_shared<DataPreprocessor>());
  const Batch data = model->data_preprocessor()(Batch{{"image", torch::rand({2, 3, 4, 4})}}, true);
  EXPECT_TRUE(data.at("image").is_contiguous(c10::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(data.at("image").is_contiguous());
}

TEST(MemoryFormat, ChannelsLast3dAppliesToRankFiveOnly) {
  EXPECT_TRUE(memory_format_applies(torch::zeros({1, 2, 3, 4, 5}), c10::MemoryFormat::ChannelsLast3d));
  EXPECT_FALSE(memory_format_applies(torch::zeros({1, 2, 3, 4}), c10::MemoryFormat::ChannelsLast3d));
  EXPECT_FALSE(memory_format_applies(torch::zeros({1, 2, 3, 4, 5}), c10::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(memory_format_applies(torch::Tensor(), c10::MemoryFormat::ChannelsLast));
}

TEST(MemoryFormat, AnUnknownFormatNamesTheFileLineAndTheChoices) {
  try {
    conv_net("  memory_format: nhwc\n");
    FAIL() << "nhwc was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("net.yaml:7"), std::string::npos) << message;
    EXPECT_NE(message.find("channels_last"), std::string::npos) << message;
    EXPECT_NE(message.find("'nhwc'"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace lockstep
