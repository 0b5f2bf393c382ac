#include "lockstep/evaluation/metric.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

TEST(AccuracyTest, TopKAgainstHandCountedHits) {
  Accuracy accuracy({1, 2});
  // Sample 0: label 2, best class 2 (top-1 hit). Sample 1: label 0, ranked
  // second (top-2 hit only). Sample 2: label 1, ranked last (miss).
  torch::Tensor logits = torch::tensor({{0.1, 0.2, 0.9}, {0.5, 0.1, 0.7}, {0.9, 0.0, 0.5}});
  accuracy.process(Batch{{"label", torch::tensor({2, 0, 1})}}, Batch{{"logits", logits}});
  auto metrics = accuracy.compute(accuracy.results());
  EXPECT_DOUBLE_EQ(metrics.at("top1"), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(metrics.at("top2"), 2.0 / 3.0);
}

TEST(EvaluatorTest, CutsRepeatedPaddingSamplesAtTheDatasetSize) {
  Evaluator evaluator({std::make_shared<Accuracy>(std::vector<int64_t>{1})});
  // Five real samples, all correct, then three padding repeats that are wrong:
  // only the first five may count.
  torch::Tensor logits = torch::zeros({8, 2});
  logits.index_put_({torch::indexing::Slice(0, 5), 1}, 1.0);
  torch::Tensor labels = torch::tensor({1, 1, 1, 1, 1, 0, 0, 0});
  evaluator.process(Batch{{"label", labels}}, Batch{{"logits", logits}});
  auto metrics = evaluator.evaluate(/*dataset_size=*/5);
  EXPECT_DOUBLE_EQ(metrics.at("accuracy/top1"), 1.0);
  // The metric was reset for the next pass.
  EXPECT_TRUE(evaluator.metrics().front()->results().empty());
}

TEST(AccuracyTest, ShapesAreChecked) {
  Accuracy accuracy;
  EXPECT_THROW(accuracy.process(Batch{{"label", torch::tensor({1, 2})}}, Batch{{"logits", torch::zeros({3, 4})}}), Error);
  EXPECT_THROW(Accuracy(std::vector<int64_t>{0}), Error);
}

}  // namespace
}  // namespace lockstep
