// TensorBoard event files, read back by readers that share nothing with the
// writer: the record framing and CRC-32C are checked here bit by bit, each
// record is decoded by protoc (raw, and against a schema with TensorFlow's
// field numbers), and PNG images by a Python decoder.
#include "lockstep/events/tensorboard_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/runner/runner.h"
#include "lockstep/events/tensorboard_event.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;


uint32_t bitwise_crc32c(const char* data, size_t size) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= static_cast<uint8_t>(data[i]);
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t little_endian(const std::string& bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[at + i]);
  return value;
}

// Splits a TFRecord file into its records, checking both CRCs of each.
std::vector<std::string> read_records(const std::string& path) {
  const std::string file = testing::read_file(path);
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_LE(at + 12, file.size()) << "truncated record header at byte " << at;
    if (at + 12 > file.size()) break;
    const uint64_t length = little_endian(file, at, 8);
    EXPECT_EQ(little_endian(file, at + 8, 4), masked(bitwise_crc32c(file.data() + at, 8)))
        << "length CRC of the record at byte " << at;
    EXPECT_LE(at + 12 + length + 4, file.size()) << "truncated record at byte " << at;
    if (at + 12 + length + 4 > file.size()) break;
    std::string data = file.substr(at + 12, length);
    EXPECT_EQ(little_endian(file, at + 12 + length, 4), masked(bitwise_crc32c(data.data(), data.size())))
        << "data CRC of the record at byte " << at;
    records.push_back(std::move(data));
    at += 12 + length + 4;
  }
  return records;
}

// protobuf's text format, as protoc prints it: "name: value" and "name {" ... "}".
struct TextMessage {
  std::vector<std::pair<std::string, std::string>> fields;
  std::vector<std::pair<std::string, TextMessage>> children;

  std::string field(const std::string& name) const {
    for (const auto& [key, value] : fields) {
      if (key == name) return value;
    }
    return "";
  }
  std::vector<double> numbers(const std::string& name) const {
    std::vector<double> values;
    for (const auto& [key, value] : fields) {
      if (key == name) values.push_back(std::stod(value));
    }
    return values;
  }
  std::vector<const TextMessage*> all(const std::string& name) const {
    std::vector<const TextMessage*> found;
    for (const auto& [key, child] : children) {
      if (key == name) found.push_back(&child);
    }
    return found;
  }
  const TextMessage* child(const std::string& name) const {
    auto found = all(name);
    return found.empty() ? nullptr : found.front();
  }
};

TextMessage parse_text_format(const std::string& text) {
  TextMessage root;
  std::vector<TextMessage*> open{&root};
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos) continue;
    line = line.substr(start);
    if (line == "}") {
      open.pop_back();
    } else if (line.size() > 2 && line.compare(line.size() - 2, 2, " {") == 0 && line.find(':') == std::string::npos) {
      open.back()->children.emplace_back(line.substr(0, line.size() - 2), TextMessage());
      open.push_back(&open.back()->children.back().second);
    } else {
      const size_t colon = line.find(": ");
      open.back()->fields.emplace_back(line.substr(0, colon), line.substr(colon + 2));
    }
  }
  return root;
}

// The bytes of a text-format string literal ("\211PNG\r\n...").
std::string unescape(const std::string& literal) {
  std::string out;
  for (size_t i = 1; i + 1 < literal.size(); ++i) {
    if (literal[i] != '\\') {
      out.push_back(literal[i]);
      continue;
    }
    const char c = literal[++i];
    if (c >= '0' && c <= '7') {
      int value = 0;
      for (int digits = 0; digits < 3 && literal[i] >= '0' && literal[i] <= '7'; ++digits) value = value * 8 + (literal[i++] - '0');
      --i;
      out.push_back(static_cast<char>(value));
    } else if (c == 'x') {
      out.push_back(static_cast<char>(std::stoi(literal.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c);
    }
  }
  return out;
}

bool have_protoc() {
  static const bool have = testing::run_command({"protoc", "--version"}).exit_code == 0;
  return have;
}

// Every record of the file, decoded by protoc against the schema.
std::vector<TextMessage> decode_events(const std::string& path) {
  testing::TempDir dir;
  testing::write_file(dir.file("event.proto"),
                      testing::read_file(testing::source_dir() + "/lockstep/events/testdata/tensorboard_event.proto"));
  std::vector<TextMessage> events;
  const auto records = read_records(path);
  for (size_t i = 0; i < records.size(); ++i) {
    const std::string record_file = dir.file("record" + std::to_string(i));
    testing::write_file(record_file, records[i]);
    auto raw = testing::run_command({"/bin/sh", "-c", "protoc --decode_raw < '" + record_file + "'"});
    EXPECT_EQ(raw.exit_code, 0) << "record " << i << " is not a protobuf message: " << raw.output;
    auto typed = testing::run_command({"/bin/sh", "-c",
                                       "protoc --proto_path='" + dir.path() + "' --decode=tensorboard.Event '" +
                                           dir.file("event.proto") + "' < '" + record_file + "'"});
    EXPECT_EQ(typed.exit_code, 0) << "record " << i << ": " << typed.output;
    events.push_back(parse_text_format(typed.output));
  }
  return events;
}

// (step, tag) -> simple_value of every scalar in the events.
std::map<std::pair<int64_t, std::string>, double> scalars_of(const std::vector<TextMessage>& events) {
  std::map<std::pair<int64_t, std::string>, double> scalars;
  for (const auto& event : events) {
    const TextMessage* summary = event.child("summary");
    if (summary == nullptr) continue;
    const int64_t step = event.field("step").empty() ? 0 : std::stoll(event.field("step"));
    for (const TextMessage* value : summary->all("value")) {
      if (value->field("simple_value").empty()) continue;
      scalars[{step, unescape(value->field("tag"))}] = std::stod(value->field("simple_value"));
    }
  }
  return scalars;
}

const TextMessage* find_value(const std::vector<TextMessage>& events, const std::string& tag, int64_t* step = nullptr) {
  for (const auto& event : events) {
    const TextMessage* summary = event.child("summary");
    if (summary == nullptr) continue;
    for (const TextMessage* value : summary->all("value")) {
      if (unescape(value->field("tag")) == tag) {
        if (step != nullptr) *step = event.field("step").empty() ? 0 : std::stoll(event.field("step"));
        return value;
      }
    }
  }
  return nullptr;
}

#define REQUIRE_PROTOC() \
  if (!have_protoc()) GTEST_SKIP() << "protoc (protobuf-compiler) is not installed"

TEST(TensorBoardWriterTest, FileNameAndFirstRecordFollowTensorFlow) {
  REQUIRE_PROTOC();
  testing::TempDir dir;
  std::string path;
  {
    TensorBoardWriter writer(dir.file("logs/run"));
    path = writer.path();
  }
  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir.file("logs/run")));
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  auto events = decode_events(path);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].field("file_version"), "\"brain.Event:2\"");
  const double wall_time = std::stod(events[0].field("wall_time"));
  EXPECT_GT(wall_time, 1.5e9) << "wall_time is not seconds since the epoch";
  // A second writer in the same directory (and second) gets its own file.
  TensorBoardWriter second(dir.file("logs/run"));
  EXPECT_NE(second.path(), path);
}

TEST(TensorBoardWriterTest, ScalarsOnlyNewOnesSmoothedAtTheirSteps) {
  REQUIRE_PROTOC();
  testing::TempDir dir;
  EventStorage storage(0);
  TensorBoardWriter writer(dir.path(), /*window=*/2);
  for (int i = 0; i < 4; ++i) {
    storage.put_scalar("loss", 10.0 - i);
    storage.put_scalar("lr", 0.1 * (i + 1), /*smoothing_hint=*/false);
    if (i == 1) storage.put_scalar("val/accuracy", 0.5, false);
    if (i % 2 == 1) writer.write(storage, 4);  // after iterations 1 and 3
    storage.step();
  }
  writer.close();
  auto events = decode_events(writer.path());
  // file_version, then one event per written iteration.
  ASSERT_EQ(events.size(), 3u);
  auto scalars = scalars_of(events);
  const std::map<std::pair<int64_t, std::string>, double> expected{
      {{1, "loss"}, 9.5},  // median of the last 2: {10, 9}
      {{1, "lr"}, 0.2},
      {{1, "val/accuracy"}, 0.5},
      {{3, "loss"}, 7.5},  // {8, 7}
      {{3, "lr"}, 0.4},
  };
  ASSERT_EQ(scalars.size(), expected.size());
  for (const auto& [key, value] : expected) {
    ASSERT_TRUE(scalars.count(key)) << "no " << key.second << " at step " << key.first;
    // simple_value is a float, printed by protoc as the shortest text that reads back as that float.
    EXPECT_EQ(static_cast<float>(scalars.at(key)), static_cast<float>(value)) << key.second << "@" << key.first;
  }
}

TEST(TensorBoardWriterTest, ImagesArePngsThatDecodeToThePixels) {
  REQUIRE_PROTOC();
  if (testing::run_command({testing::python(), "-c", "import zlib"}).exit_code != 0) GTEST_SKIP() << "no python3";
  testing::TempDir dir;
  EventStorage storage(0);
  TensorBoardWriter writer(dir.path());
  torch::manual_seed(3);
  torch::Tensor rgb = torch::randint(0, 256, {3, 4, 6}, torch::kUInt8);
  storage.set_iter(7);
  storage.put_image("samples/rgb", rgb);
  storage.put_image("samples/gray", torch::tensor({0.0, 0.25, 1.0, 0.5}, torch::kFloat).view({1, 2, 2}));
  writer.write(storage, 10);
  EXPECT_TRUE(storage.images().empty()) << "written images stay in the storage";
  writer.close();
  auto events = decode_events(writer.path());

  struct Expected {
    std::string tag;
    int channels, height, width;
    std::vector<int> pixels;  // H x W x C
  };
  torch::Tensor hwc = rgb.permute({1, 2, 0}).contiguous().to(torch::kInt);
  const std::vector<Expected> expected{
      {"samples/rgb", 3, 4, 6, std::vector<int>(hwc.data_ptr<int>(), hwc.data_ptr<int>() + hwc.numel())},
      {"samples/gray", 1, 2, 2, {0, 64, 255, 128}},  // round(255 * v), halves to even
  };
  for (const auto& want : expected) {
    int64_t step = -1;
    const TextMessage* value = find_value(events, want.tag, &step);
    ASSERT_NE(value, nullptr) << want.tag;
    EXPECT_EQ(step, 7);
    const TextMessage* image = value->child("image");
    ASSERT_NE(image, nullptr) << want.tag;
    EXPECT_EQ(image->field("height"), std::to_string(want.height));
    EXPECT_EQ(image->field("width"), std::to_string(want.width));
    EXPECT_EQ(image->field("colorspace"), std::to_string(want.channels));
    testing::write_file(dir.file("image.png"), unescape(image->field("encoded_image_string")));
    auto decoded = testing::run_command(
        {testing::python(), testing::source_dir() + "/lockstep/core/testdata/decode_png.py", dir.file("image.png")});
    ASSERT_EQ(decoded.exit_code, 0) << decoded.output;
    auto png = nlohmann::json::parse(decoded.output);
    EXPECT_EQ(png["channels"], want.channels);
    EXPECT_EQ(png["pixels"].get<std::vector<int>>(), want.pixels) << want.tag;
  }
}

TEST(TensorBoardWriterTest, HistogramsHaveTheStatisticsAndTensorFlowBuckets) {
  REQUIRE_PROTOC();
  testing::TempDir dir;
  EventStorage storage(0);
  TensorBoardWriter writer(dir.path());
  const std::vector<double> values{-3.0, -0.5, 0.0, 0.0, 1e-3, 1.0, 1.0, 2.5, 100.0};
  storage.set_iter(5);
  // A NaN and an infinity are left out (TensorFlow refuses them).
  std::vector<double> with_junk = values;
  with_junk.push_back(std::nan(""));
  with_junk.push_back(INFINITY);
  storage.put_histogram("weights", torch::tensor(with_junk, torch::kDouble).view({1, -1}));
  writer.write(storage, 10);
  EXPECT_TRUE(storage.histograms().empty());
  writer.close();

  int64_t step = -1;
  auto events = decode_events(writer.path());
  const TextMessage* value = find_value(events, "weights", &step);
  ASSERT_NE(value, nullptr);
  EXPECT_EQ(step, 5);
  const TextMessage* histo = value->child("histo");
  ASSERT_NE(histo, nullptr);
  EXPECT_EQ(std::stod(histo->field("min")), -3.0);
  EXPECT_EQ(std::stod(histo->field("max")), 100.0);
  EXPECT_EQ(std::stod(histo->field("num")), 9.0);
  EXPECT_NEAR(std::stod(histo->field("sum")), 101.001, 1e-9);
  EXPECT_NEAR(std::stod(histo->field("sum_squares")), 9 + 0.25 + 1e-6 + 1 + 1 + 6.25 + 10000, 1e-9);

  const auto limits = histo->numbers("bucket_limit");
  const auto counts = histo->numbers("bucket");
  ASSERT_EQ(limits.size(), counts.size());
  ASSERT_FALSE(limits.empty());
  // Limits ascend, and the counts add up.
  double total = 0;
  for (size_t i = 0; i < limits.size(); ++i) {
    if (i > 0) EXPECT_LT(limits[i - 1], limits[i]);
    total += counts[i];
  }
  EXPECT_EQ(total, 9.0);
  // Each non-empty bucket holds exactly the values in [previous limit, limit).
  // Its limit is 0 or +-1e-12 * 1.1^k, and it is the first such limit above
  // the value, so a value v > 0 has limit / 1.1 <= v < limit.
  for (size_t i = 0; i < limits.size(); ++i) {
    if (counts[i] == 0) continue;
    const double lower = i == 0 ? -INFINITY : limits[i - 1];
    int inside = 0;
    for (double v : values) inside += (v >= lower && v < limits[i]) ? 1 : 0;
    EXPECT_EQ(counts[i], inside) << "bucket [" << lower << ", " << limits[i] << ")";
    if (limits[i] != 0) {
      const double k = std::log(std::abs(limits[i]) / 1e-12) / std::log(1.1);
      EXPECT_NEAR(k, std::round(k), 1e-6) << limits[i] << " is not 1e-12 * 1.1^k";
    }
  }
  for (double v : values) {
    if (v <= 0) continue;
    size_t i = 0;
    while (i < limits.size() && !(v < limits[i])) ++i;
    ASSERT_LT(i, limits.size());
    EXPECT_LE(limits[i] / 1.1, v * (1 + 1e-12)) << "value " << v << " is not in the first bucket above it";
  }
  // TensorFlow's default bucket layout: 0 in the middle, DBL_MAX at the ends.
  const auto& all = tensorboard::default_histogram_bucket_limits();
  EXPECT_EQ(all.size() % 2, 1u);
  EXPECT_EQ(all[all.size() / 2], 0.0);
  EXPECT_EQ(all.back(), DBL_MAX);
  EXPECT_EQ(all.front(), -DBL_MAX);
  EXPECT_DOUBLE_EQ(all[all.size() / 2 + 1], 1e-12);
}

TEST(TensorBoardWriterTest, ParameterHistogramsNameEveryParameter) {
  EventStorage storage(0);
  torch::nn::Linear linear(3, 2);
  put_parameter_histograms(storage, *linear);
  std::set<std::string> names;
  for (const auto& histogram : storage.histograms()) names.insert(histogram.name);
  EXPECT_EQ(names, (std::set<std::string>{"params/weight", "params/bias"}));
}

TEST(TensorBoardWriterTest, BadImagesNameTheirTag) {
  testing::TempDir dir;
  TensorBoardWriter writer(dir.path());
  try {
    writer.add_image("samples/bad", torch::zeros({2, 4, 4}), 0);
    FAIL() << "a 2-channel image was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("samples/bad"), std::string::npos) << error.what();
  }
}

// default_hooks.logger.tensorboard: a whole run writes its losses and lr.
TEST(TensorBoardWriterTest, LoggerHookWritesEventFilesIntoTheWorkDir) {
  REQUIRE_PROTOC();
  testing::TempDir dir;
  Config config = load_config(testing::source_dir() + "/lockstep/events/testdata/tensorboard_run.yaml");
  {
    Runner runner(config, RunnerOptions().work_dir(dir.path()));
    runner.train();
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    if (entry.path().filename().string().find("tfevents") != std::string::npos) files.push_back(entry.path());
  }
  ASSERT_EQ(files.size(), 1u);
  auto scalars = scalars_of(decode_events(files[0]));
  for (int64_t step : {1, 3}) {
    EXPECT_TRUE(scalars.count({step, "loss"})) << "no loss at step " << step;
    EXPECT_TRUE(scalars.count({step, "lr"})) << "no lr at step " << step;
    if (scalars.count({step, "lr"})) EXPECT_FLOAT_EQ(scalars.at({step, "lr"}), 0.1);
  }
  EXPECT_FALSE(scalars.count({0, "loss"})) << "the writer wrote between its intervals";
}

}  // namespace
}  // namespace lockstep
