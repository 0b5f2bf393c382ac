#include "lockstep/core/png.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "lockstep/core/error.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

bool have_python() {
  static const bool have = testing::run_command({testing::python(), "-c", "import zlib, struct, json"}).exit_code == 0;
  return have;
}

// Decodes `png` with the independent Python reader; returns its JSON.
nlohmann::json decode_with_python(const std::string& png) {
  testing::TempDir dir;
  testing::write_file(dir.file("image.png"), png);
  auto result = testing::run_command(
      {testing::python(), testing::source_dir() + "/lockstep/core/testdata/decode_png.py", dir.file("image.png")});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return result.exit_code == 0 ? nlohmann::json::parse(result.output) : nlohmann::json();
}

std::vector<int> hwc_values(const torch::Tensor& chw_uint8) {
  torch::Tensor hwc = chw_uint8.permute({1, 2, 0}).contiguous().to(torch::kInt);
  return std::vector<int>(hwc.data_ptr<int>(), hwc.data_ptr<int>() + hwc.numel());
}

TEST(PngTest, RgbBytesDecodeToTheSamePixels) {
  if (!have_python()) GTEST_SKIP() << "/usr/bin/python3 is missing";
  torch::manual_seed(1);
  torch::Tensor image = torch::randint(0, 256, {3, 5, 7}, torch::kUInt8);
  auto decoded = decode_with_python(encode_png(image));
  ASSERT_FALSE(decoded.is_null());
  EXPECT_EQ(decoded["width"], 7);
  EXPECT_EQ(decoded["height"], 5);
  EXPECT_EQ(decoded["color_type"], 2);
  EXPECT_EQ(decoded["pixels"].get<std::vector<int>>(), hwc_values(image));
}

TEST(PngTest, GrayAndRgbaAndFloatPixels) {
  if (!have_python()) GTEST_SKIP() << "/usr/bin/python3 is missing";
  // Floats in [0, 1] scale by 255 and round; out-of-range values clamp.
  torch::Tensor gray = torch::tensor({0.0, 0.5, 1.0, 2.0, -1.0, 0.1}, torch::kFloat).view({2, 3});
  auto decoded = decode_with_python(encode_png(gray, /*compression_level=*/9));
  ASSERT_FALSE(decoded.is_null());
  EXPECT_EQ(decoded["color_type"], 0);
  EXPECT_EQ(decoded["pixels"].get<std::vector<int>>(), (std::vector<int>{0, 128, 255, 255, 0, 26}));

  torch::Tensor rgba = torch::arange(4 * 2 * 2, torch::kUInt8).view({4, 2, 2});
  decoded = decode_with_python(encode_png(rgba, 0));
  ASSERT_FALSE(decoded.is_null());
  EXPECT_EQ(decoded["color_type"], 6);
  EXPECT_EQ(decoded["pixels"].get<std::vector<int>>(), hwc_values(rgba));
}

TEST(PngTest, RejectsWhatPngCannotHold) {
  EXPECT_THROW(encode_png(torch::zeros({2, 4, 4}, torch::kUInt8)), Error);  // 2 channels
  EXPECT_THROW(encode_png(torch::zeros({1, 1, 4, 4}, torch::kUInt8)), Error);
  EXPECT_THROW(encode_png(torch::zeros({3, 0, 4}, torch::kUInt8)), Error);
  EXPECT_THROW(encode_png(torch::zeros({3, 4, 4}, torch::kInt)), Error);
  EXPECT_THROW(encode_png(torch::Tensor()), Error);
  try {
    encode_png(torch::zeros({5, 4, 4}));
    FAIL() << "5 channels were accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("1, 3 or 4 channels"), std::string::npos) << error.what();
  }
}

TEST(PngTest, ImageGridTilesWithPadding) {
  // Three 1x2x2 images, two per row, padding 1 of value 9:
  //   9 9 9 9 9 9 9
  //   9 a a 9 b b 9
  //   9 a a 9 b b 9
  //   9 9 9 9 9 9 9
  //   9 c c 9 9 9 9   (the empty fourth slot stays padding)
  //   9 c c 9 9 9 9
  //   9 9 9 9 9 9 9
  torch::Tensor batch = torch::stack({torch::full({1, 2, 2}, 1.0), torch::full({1, 2, 2}, 2.0), torch::full({1, 2, 2}, 3.0)});
  torch::Tensor grid = image_grid(batch, /*columns=*/2, /*padding=*/1, /*pad_value=*/9.0);
  ASSERT_EQ(grid.sizes(), (std::vector<int64_t>{1, 7, 7}));
  torch::Tensor expected = torch::full({7, 7}, 9.0);
  expected.slice(0, 1, 3).slice(1, 1, 3).fill_(1.0);
  expected.slice(0, 1, 3).slice(1, 4, 6).fill_(2.0);
  expected.slice(0, 4, 6).slice(1, 1, 3).fill_(3.0);
  EXPECT_TRUE(torch::equal(grid[0], expected)) << grid;
  EXPECT_THROW(image_grid(torch::zeros({3, 4, 4})), Error);
}

TEST(PngTest, WritePngWritesTheEncodedBytes) {
  testing::TempDir dir;
  torch::Tensor image = torch::randint(0, 256, {1, 3, 3}, torch::kUInt8);
  write_png(dir.file("a.png"), image);
  EXPECT_EQ(testing::read_file(dir.file("a.png")), encode_png(image));
}

}  // namespace
}  // namespace lockstep
