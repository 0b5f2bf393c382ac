#include "lockstep/events/event_storage.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

using ::testing::ElementsAre;

// The names of every scalar put so far, sorted.
std::vector<std::string> scalar_names(const EventStorage& storage) {
  std::vector<std::string> names;
  for (const auto& [name, event] : storage.latest()) names.push_back(name);
  return names;
}

TEST(HistoryBufferTest, StatisticsMatchHandComputedValues) {
  HistoryBuffer history;
  const double values[] = {5, 1, 4, 2, 3, 10};
  for (int i = 0; i < 6; ++i) history.update(values[i], i);
  EXPECT_DOUBLE_EQ(history.latest(), 10);
  EXPECT_DOUBLE_EQ(history.median(3), 3);        // {2, 3, 10}
  EXPECT_DOUBLE_EQ(history.median(4), 3.5);      // {4, 2, 3, 10} -> (3 + 4) / 2
  EXPECT_DOUBLE_EQ(history.median(100), 3.5);    // all six: {1,2,3,4,5,10}
  EXPECT_DOUBLE_EQ(history.avg(2), 6.5);         // (3 + 10) / 2
  EXPECT_DOUBLE_EQ(history.global_avg(), 25.0 / 6.0);
}

TEST(HistoryBufferTest, GlobalAverageCountsDroppedValues) {
  HistoryBuffer history(/*max_length=*/2);
  history.update(1, 0);
  history.update(2, 1);
  history.update(6, 2);
  EXPECT_EQ(history.size(), 2u);
  EXPECT_DOUBLE_EQ(history.avg(10), 4.0);
  EXPECT_DOUBLE_EQ(history.global_avg(), 3.0);
}

TEST(EventStorageTest, SmoothingHintChoosesMedianOrLatest) {
  EventStorage storage(0);
  const double losses[] = {9, 1, 2};
  for (double loss : losses) {
    storage.put_scalar("loss", loss);
    storage.put_scalar("lr", loss * 10, /*smoothing_hint=*/false);
    storage.step();
  }
  auto smoothed = storage.latest_with_smoothing_hint(20);
  EXPECT_DOUBLE_EQ(smoothed.at("loss").value, 2);   // median of {9, 1, 2}
  EXPECT_EQ(smoothed.at("loss").iteration, 2);
  EXPECT_DOUBLE_EQ(smoothed.at("lr").value, 20);    // latest
  EXPECT_DOUBLE_EQ(storage.latest().at("loss").value, 2);
  EXPECT_THROW(storage.put_scalar("loss", 1, /*smoothing_hint=*/false), Error);
}

TEST(EventStorageTest, NameScopesNestAndRestore) {
  EventStorage storage;
  {
    auto outer = storage.name_scope("val");
    storage.put_scalar("accuracy", 0.9);
    {
      auto inner = storage.name_scope("top");
      storage.put_scalar("k", 5);
    }
    storage.put_scalar("loss", 0.3);
  }
  storage.put_scalar("loss", 1.0);
  EXPECT_THAT(scalar_names(storage), ElementsAre("loss", "val/accuracy", "val/loss", "val/top/k"));
}

// The asynchronous metric writer puts scalars from its own thread while the
// main thread evaluates inside a "val" scope: neither may rename the other's.
TEST(EventStorageTest, NameScopesBelongToTheThreadThatOpenedThem) {
  EventStorage storage;
  auto scope = storage.name_scope("val");
  std::thread writer([&] {
    storage.put_scalar("loss", 0.5);
    auto own = storage.name_scope("train");
    storage.put_scalar("lr", 0.1);
  });
  writer.join();
  storage.put_scalar("accuracy", 0.9);
  EXPECT_THAT(scalar_names(storage), ElementsAre("loss", "train/lr", "val/accuracy"));
}

TEST(EventStorageTest, ExplicitIterationAndMissingNames) {
  EventStorage storage(7);
  storage.put_scalar("a", 1.0, true, /*iteration=*/3);
  storage.put_scalar("b", 2.0);
  EXPECT_EQ(storage.latest().at("a").iteration, 3);
  EXPECT_EQ(storage.latest().at("b").iteration, 7);
  try {
    storage.history("c");
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("a, b"), std::string::npos) << error.what();
  }
}

TEST(EventStorageTest, ImagesAndHistogramsAreKeptUntilCleared) {
  EventStorage storage(2);
  storage.put_image("samples", torch::zeros({3, 4, 4}));
  storage.put_histogram("weights", torch::arange(6).view({2, 3}));
  ASSERT_EQ(storage.images().size(), 1u);
  EXPECT_EQ(storage.images()[0].iteration, 2);
  ASSERT_EQ(storage.histograms().size(), 1u);
  EXPECT_EQ(storage.histograms()[0].values.numel(), 6);
  storage.clear_images();
  storage.clear_histograms();
  EXPECT_TRUE(storage.images().empty());
  EXPECT_TRUE(storage.histograms().empty());
}

}  // namespace
}  // namespace lockstep
