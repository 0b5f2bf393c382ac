// DatasetSubset through a loader section's `dataset.indices` (mmengine's key).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/data/data_loader.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using testing::error_of;

// mmengine's `indices`: a count takes the first examples, a list those
// examples in its order; both are checked against the dataset's size.
TEST(BuildDataLoader, IndicesTakePartOfTheDatasetAsMmengineDoes) {
  const std::string loader = "{batch_size: 4, sampler: {type: SequentialSampler}, dataset: ";
  auto whole = build_data_loader(parse_config(loader + "{type: FashionMNIST, split: test}}"), {});
  const Batch reference = whole->dataset().get_batch({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 0);

  auto first = build_data_loader(parse_config(loader + "{type: FashionMNIST, split: test, indices: 10}}"), {});
  EXPECT_EQ(first->dataset().size(), 10);
  EXPECT_EQ(first->batches_per_epoch(), 3);
  Batch batch = first->next();
  EXPECT_TRUE(torch::equal(batch.at("image"), reference.at("image").slice(0, 0, 4)));

  auto chosen =
      build_data_loader(parse_config(loader + "{type: FashionMNIST, split: test, indices: [12, 0, 7, 7]}}"), {});
  EXPECT_EQ(chosen->dataset().size(), 4);
  batch = chosen->next();
  EXPECT_TRUE(torch::equal(batch.at("label"), reference.at("label").index_select(0, torch::tensor({12, 0, 7, 7}))));

  const auto error = [&](const std::string& indices) {
    return error_of([&] {
      build_data_loader(parse_config(loader + "{type: FashionMNIST, split: test, indices: " + indices + "}}", "l.yaml"),
                        {});
    });
  };
  EXPECT_THAT(error("0"), HasSubstr("l.yaml:1 (key dataset.indices): indices must be a positive count"));
  EXPECT_THAT(error("10001"), HasSubstr("indices asks for the first 10001 examples of a dataset of 10000"));
  EXPECT_THAT(error("[3, 10000]"), HasSubstr("index 10000 is outside the dataset's 10000 examples"));
  EXPECT_THAT(error("[]"), HasSubstr("indices is an empty list"));
}

}  // namespace
}  // namespace lockstep
