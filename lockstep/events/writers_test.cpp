#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/events/console_writer.h"
#include "lockstep/events/json_writer.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(testing::read_file(path));
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(JsonWriterTest, WritesOnlyNewScalarsGroupedByIteration) {
  testing::TempDir dir;
  EventStorage storage(0);
  JsonWriter writer(dir.file("metrics.jsonl"), /*window=*/2);
  for (int i = 0; i < 4; ++i) {
    storage.put_scalar("loss", 10.0 - i);
    storage.put_scalar("lr", 0.1, false);
    if (i == 1) storage.put_scalar("val/accuracy", 0.5, false);
    if (i % 2 == 1) writer.write(storage, 4);  // after iterations 1 and 3
    storage.step();
  }
  auto lines = read_lines(dir.file("metrics.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["iteration"], 1);
  EXPECT_DOUBLE_EQ(lines[0]["loss"].get<double>(), 9.5);  // median of the last 2: {10, 9}
  EXPECT_DOUBLE_EQ(lines[0]["val/accuracy"].get<double>(), 0.5);
  EXPECT_EQ(lines[1]["iteration"], 3);
  EXPECT_DOUBLE_EQ(lines[1]["loss"].get<double>(), 7.5);  // {8, 7}
  EXPECT_FALSE(lines[1].contains("val/accuracy")) << "an old scalar was written again";
}

TEST(JsonWriterTest, NonFiniteValuesKeepTheLineValid) {
  testing::TempDir dir;
  EventStorage storage(0);
  JsonWriter writer(dir.file("m.jsonl"));
  storage.put_scalar("loss", std::nan(""), false);
  writer.write(storage, 1);
  auto lines = read_lines(dir.file("m.jsonl"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["loss"], "NaN");
}

TEST(ConsoleWriterTest, LineShowsProgressSmoothedLossesTimingAndEta) {
  EventStorage storage(0);
  for (int i = 0; i < 10; ++i) {
    storage.put_scalar("loss_cls", 1.0);
    storage.put_scalar("loss", 1.0);
    storage.put_scalar("time", 0.5);
    storage.put_scalar("data_time", 0.01);
    storage.put_scalar("lr", 0.02, false);
    if (i < 9) storage.step();
  }
  ConsoleWriter writer(20);
  std::string line = writer.format_line(storage, 100);
  // 90 iterations left at a median of 0.5 s each: 45 s.
  EXPECT_NE(line.find("eta: 0:00:45"), std::string::npos) << line;
  EXPECT_NE(line.find("iter: 9/100"), std::string::npos) << line;
  EXPECT_NE(line.find("loss: 1"), std::string::npos) << line;
  EXPECT_NE(line.find("time: 0.5000"), std::string::npos) << line;
  EXPECT_NE(line.find("data_time: 0.0100"), std::string::npos) << line;
  EXPECT_NE(line.find("lr: 0.02"), std::string::npos) << line;
}

TEST(ConsoleWriterTest, DurationsReadLikeClocks) {
  EXPECT_EQ(format_duration(0), "0:00:00");
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(2 * 86400 + 61), "2 days, 0:01:01");
}

}  // namespace
}  // namespace lockstep
