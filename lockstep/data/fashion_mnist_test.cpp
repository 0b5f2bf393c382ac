#include "lockstep/data/fashion_mnist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/data/idx_file.h"
#include "lockstep/data/testdata/idx_fixture.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace lockstep::testing;  // the IDX fixture, TempDir and write_file

// Loading 60000 images takes a moment; share one copy across tests.
const FashionMNIST& train_set() {
  static const FashionMNIST data(FashionMNIST::kDefaultRoot, "train");
  return data;
}

const FashionMNIST& test_set() {
  static const FashionMNIST data(FashionMNIST::kDefaultRoot, "test");
  return data;
}

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

std::string construct_error(const std::string& root, const std::string& split) {
  try {
    FashionMNIST data(root, split);
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "FashionMNIST(" << root << ", " << split << ") did not fail";
  return "";
}

// Reference values below come from an independent read of the same files
// with Python's gzip + numpy.
TEST(FashionMNIST, TrainSplitMatchesIndependentRead) {
  const auto& data = train_set();
  EXPECT_EQ(data.size(), 60000);
  const torch::Tensor& images = data.tensors().at("image");
  const torch::Tensor& labels = data.tensors().at("label");
  EXPECT_EQ(images.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(labels.scalar_type(), torch::kLong);
  EXPECT_EQ(to_vector(labels.slice(0, 0, 12)), (std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9}));
  EXPECT_EQ(to_vector(torch::bincount(labels)), std::vector<int64_t>(10, 6000));
  EXPECT_EQ(images[0].sum().item<int64_t>(), 76247);
  EXPECT_EQ(images[59999].sum().item<int64_t>(), 16684);
  EXPECT_EQ(images.sum(torch::kLong).item<int64_t>(), 3431114169LL);
  EXPECT_EQ(to_vector(images[0][0][14]),
            (std::vector<int64_t>{0,   0,   1,   4,   6,   7,   2,   0,   0,   0,   0,   0,   237, 226,
                                  217, 223, 222, 219, 222, 221, 216, 223, 229, 215, 218, 255, 77,  0}));
}

TEST(FashionMNIST, TestSplitMatchesIndependentRead) {
  const auto& data = test_set();
  EXPECT_EQ(data.size(), 10000);
  const torch::Tensor& images = data.tensors().at("image");
  const torch::Tensor& labels = data.tensors().at("label");
  EXPECT_EQ(to_vector(labels.slice(0, 0, 12)), (std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5}));
  EXPECT_EQ(to_vector(torch::bincount(labels)), std::vector<int64_t>(10, 1000));
  EXPECT_EQ(images[0].sum().item<int64_t>(), 33456);
  EXPECT_EQ(images.sum(torch::kLong).item<int64_t>(), 573469082LL);
}

TEST(FashionMNIST, GetBatchGathersRowsInIndexOrder) {
  const auto& data = test_set();
  Batch batch = data.get_batch({5, 0, 5}, 123);
  EXPECT_EQ(batch.names(), (std::vector<std::string>{"image", "label"}));
  EXPECT_EQ(to_vector(batch.at("label")), (std::vector<int64_t>{1, 9, 1}));
  EXPECT_EQ(batch.at("image").sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(batch.at("image")[1].sum().item<int64_t>(), 33456);
  EXPECT_TRUE(torch::equal(batch.at("image")[0], data.tensors().at("image")[5]));
  EXPECT_TRUE(torch::equal(batch.at("image")[0], batch.at("image")[2]));
}

TEST(FashionMNIST, MissingFilesNameThePathAndThePackage) {
  const std::string message = construct_error("/nonexistent/fmnist", "train");
  EXPECT_THAT(message, HasSubstr("/nonexistent/fmnist/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(message, HasSubstr("apt-get install dataset-fashion-mnist"));
}

TEST(FashionMNIST, UnknownSplit) {
  EXPECT_THAT(construct_error(FashionMNIST::kDefaultRoot, "val"), HasSubstr("unknown split 'val'"));
}

// Uncompressed fixtures also check the fallback to files without .gz.
TEST(FashionMNIST, ImageAndLabelCountsMustAgree) {
  TempDir dir;
  write_file(dir.file("t10k-images-idx3-ubyte"), idx_bytes(kIdxImagesMagic, {3, 28, 28}, ramp(3 * 784)));
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(kIdxLabelsMagic, {2}, std::string("\x01\x02", 2)));
  const std::string message = construct_error(dir.path(), "test");
  EXPECT_THAT(message, HasSubstr(dir.file("t10k-images-idx3-ubyte") + " holds 3 images"));
  EXPECT_THAT(message, HasSubstr(dir.file("t10k-labels-idx1-ubyte") + " holds 2 labels"));
}

TEST(FashionMNIST, LabelsOutsideTheClasses) {
  TempDir dir;
  write_file(dir.file("t10k-images-idx3-ubyte"), idx_bytes(kIdxImagesMagic, {3, 28, 28}, ramp(3 * 784)));
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(kIdxLabelsMagic, {3}, std::string("\x01\x0c\x02", 3)));
  EXPECT_THAT(construct_error(dir.path(), "test"), HasSubstr("label 12 at index 1 is outside 0..9"));
}

TEST(FashionMNIST, SmallFixtureLoads) {
  TempDir dir;
  write_file(dir.file("t10k-images-idx3-ubyte"), idx_bytes(kIdxImagesMagic, {2, 28, 28}, ramp(2 * 784)));
  testing::write_gzip_file(dir.file("t10k-labels-idx1-ubyte.gz"),
                           idx_bytes(kIdxLabelsMagic, {2}, std::string("\x07\x03", 2)));
  FashionMNIST data(dir.path(), "test");
  EXPECT_EQ(to_vector(data.tensors().at("label")), (std::vector<int64_t>{7, 3}));
  // Image 1 starts at byte 784 of the ramp: 784 mod 256 = 16.
  EXPECT_EQ(data.tensors().at("image")[1][0][0][0].item<int>(), 16);
}

TEST(FashionMNIST, BuiltFromConfig) {
  Config cfg = parse_config("type: FashionMNIST\nsplit: test\n", "data.yaml");
  auto data = dataset_registry().build(cfg);
  EXPECT_EQ(data->size(), 10000);

  Config bad = parse_config("type: FashionMNIST\nsplit: validation\n", "data.yaml");
  EXPECT_THAT(error_of([&] { dataset_registry().build(bad); }),
              AllOf(HasSubstr("data.yaml:2"), HasSubstr("unknown FashionMNIST split 'validation'")));

  Config missing = parse_config("type: FashionMNIST\nroot: /nonexistent\nsplit: train\n", "data.yaml");
  EXPECT_THAT(error_of([&] { dataset_registry().build(missing); }),
              AllOf(HasSubstr("data.yaml:2"), HasSubstr("/nonexistent/train-images-idx3-ubyte.gz")));
}

}  // namespace
}  // namespace lockstep
