#include "lockstep/events/log_processor.h"

#include <gtest/gtest.h>

#include <vector>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// Ten losses whose mean numpy (1.24) gives as 1.5638065 and a left-to-right
// sum as 1.5638064999999997 (Note [numpy's pairwise sum]).
const std::vector<double> kTenLosses = {0.275941, 2.134327, 1.976674, 2.979978, 2.483582,
                                        0.925327, 1.218795, 2.039093, 0.165432, 1.438916};

TEST(LogProcessorTest, AMeanOfTenIsNumpysToTheLastBit) {
  HistoryBuffer history;
  for (size_t i = 0; i < kTenLosses.size(); ++i) history.update(kTenLosses[i], static_cast<int64_t>(i));
  EXPECT_EQ(history.avg(10), 1.5638065);
  double left_to_right = 0;
  for (double loss : kTenLosses) left_to_right += loss;
  EXPECT_NE(left_to_right / 10, 1.5638065);  // what the test tells apart
}

TEST(LogProcessorTest, MmengineLogsWindowMeansOfMatchingNamesAndTheLatestOfOthers) {
  EventStorage storage;
  for (int64_t i = 0; i < 12; ++i) {
    storage.put_scalar("loss", static_cast<double>(i), true, i);
    storage.put_scalar("acc", static_cast<double>(100 + i), true, i);
    storage.put_scalar("lr", 0.1 * static_cast<double>(i), false, i);
  }
  storage.put_scalar("grad_norm", 4.0, true, 2);
  storage.put_scalar("grad_norm", 8.0, true, 5);
  const auto logged = LogProcessor::mmengine(/*window_size=*/10).summarize(storage);
  EXPECT_EQ(logged.at("loss").value, 6.5);  // the mean of 2..11
  EXPECT_EQ(logged.at("acc").value, 111);   // not in mean_pattern: the latest
  EXPECT_EQ(logged.at("lr").value, 0.1 * 11);
  EXPECT_EQ(logged.at("grad_norm").value, 6.0);  // the mean of its entries, not of iterations
  // grad_norm is logged on the line of the latest step metrics, as mmengine logs it at each logging iteration.
  EXPECT_EQ(logged.at("grad_norm").iteration, 11);
}

TEST(LogProcessorTest, MmenginesCustomStatisticsUseTheRawHistory) {
  EventStorage storage;
  for (int64_t i = 0; i < 30; ++i) storage.put_scalar("loss", i == 3 ? 100.0 : 1.0, true, i);
  LogProcessor::CustomStatistic global_max{"loss", "loss_max", LogProcessor::Method::kMax, std::nullopt};
  LogProcessor::CustomStatistic recent_max{"loss", "loss_recent_max", LogProcessor::Method::kMax, 5};
  const auto logged = LogProcessor::mmengine(10, kMmengineMeanPattern, {global_max, recent_max}).summarize(storage);
  EXPECT_EQ(logged.at("loss").value, 1.0);
  EXPECT_EQ(logged.at("loss_max").value, 100.0);
  EXPECT_EQ(logged.at("loss_recent_max").value, 1.0);
}

TEST(LogProcessorTest, Detectron2LogsTheMedianOfHintedScalars) {
  EventStorage storage;
  const double values[] = {5, 1, 4, 2, 3};
  for (int64_t i = 0; i < 5; ++i) {
    storage.put_scalar("loss", values[i], true, i);
    storage.put_scalar("lr", values[i], false, i);
  }
  const LogProcessor processor = LogProcessor::detectron2(/*window=*/4);
  EXPECT_FALSE(processor.logs_main_rank_values());
  const auto logged = processor.summarize(storage);
  EXPECT_EQ(logged.at("loss").value, 2.5);  // {1, 4, 2, 3}
  EXPECT_EQ(logged.at("lr").value, 3);
  EXPECT_TRUE(LogProcessor::mmengine().logs_main_rank_values());
}

TEST(LogProcessorTest, AMeanPatternThatIsNoRegexFailsSayingSo) {
  try {
    LogProcessor::mmengine(10, "(loss");
    FAIL() << "accepted '(loss'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("mean_pattern '(loss' is not a regular expression"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace lockstep
