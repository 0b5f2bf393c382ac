// lockstep's decoders and transforms against Pillow 9 and torchvision 0.14
// (Debian's python3-pil and python3-torchvision): testdata/make_reference.py
// writes test images and what Pillow and torchvision make of them, and every
// case here must match byte for byte.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "lockstep/core/read_file.h"
#include "lockstep/data/image/color.h"
#include "lockstep/data/image/image_codec.h"
#include "lockstep/data/image/image_sample.h"
#include "lockstep/data/image/transforms.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

class ImageReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::python_has("torchvision") || !testing::python_has("PIL")) return;
    dir_ = new testing::TempDir();
    auto result = testing::run_command(
        {testing::python(), testing::source_dir() + "/lockstep/data/image/testdata/make_reference.py", dir_->path()},
        {}, 300);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    manifest_ = new nlohmann::json(nlohmann::json::parse(read_file(dir_->file("manifest.json"))));
  }
  static void TearDownTestSuite() {
    delete manifest_;
    delete dir_;
    manifest_ = nullptr;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (manifest_ == nullptr) GTEST_SKIP() << "needs python3-torchvision and python3-pil";
  }

  static const nlohmann::json& manifest() { return *manifest_; }
  static std::string image_bytes(const std::string& name) { return read_file(dir_->path() + "/img/" + name); }
  static Image decode(const std::string& name, ColorMode mode) {
    const std::string bytes = image_bytes(name);
    return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), mode);
  }

  // The number of bytes that differ from the entry's reference (-1: the shape differs).
  static int64_t differences(const Image& image, const nlohmann::json& entry, std::string* detail) {
    const int height = entry["height"], width = entry["width"], channels = entry["channels"];
    if (image.height() != height || image.width() != width || image.channels() != channels) {
      *detail = str_cat("shape ", image.height(), "x", image.width(), "x", image.channels(), ", reference ", height,
                        "x", width, "x", channels);
      return -1;
    }
    const std::string reference = read_file(dir_->path() + "/ref/" + entry["ref"].get<std::string>());
    int64_t count = 0, first = -1;
    int worst = 0;
    for (size_t i = 0; i < reference.size(); ++i) {
      const int diff = std::abs(int(image.data()[i]) - int(static_cast<uint8_t>(reference[i])));
      if (diff != 0 && first < 0) first = static_cast<int64_t>(i);
      count += diff != 0;
      worst = std::max(worst, diff);
    }
    *detail = str_cat(count, " of ", reference.size(), " bytes differ (largest ", worst, ", first at byte ", first, ")");
    return count;
  }

  static ColorMode mode_of(const nlohmann::json& entry) { return entry["mode"] == "L" ? ColorMode::kGray : ColorMode::kRGB; }

  static testing::TempDir* dir_;
  static nlohmann::json* manifest_;
};

testing::TempDir* ImageReference::dir_ = nullptr;
nlohmann::json* ImageReference::manifest_ = nullptr;

TEST_F(ImageReference, DecodingEqualsPillowForEveryColourType) {
  ASSERT_GE(manifest()["decode"].size(), 20u);
  for (const auto& entry : manifest()["decode"]) {
    std::string detail;
    EXPECT_EQ(differences(decode(entry["file"], mode_of(entry)), entry, &detail), 0)
        << entry["file"] << " as " << entry["mode"] << ": " << detail;
  }
}

TEST_F(ImageReference, ScaledDecodingEqualsPillowsDraft) {
  ASSERT_GE(manifest()["draft"].size(), 18u);
  for (const auto& entry : manifest()["draft"]) {
    const std::string bytes = image_bytes(entry["file"]);
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    const int scale = entry["scale"];
    const ImageInfo info = read_image_info(data, bytes.size());
    const Image whole = decode_image(data, bytes.size(), ColorMode::kRGB,
                                     {0, 0, scaled_size(info.height, scale), scaled_size(info.width, scale)}, scale);
    std::string detail;
    EXPECT_EQ(differences(whole, entry, &detail), 0) << entry["file"] << " at 1/" << scale << ": " << detail;
    // A region (not on iMCU boundaries) is that region of the whole decode.
    const PixelRegion region{whole.height() / 3, whole.width() / 5, whole.height() / 2, whole.width() / 2};
    const Image part = decode_image(data, bytes.size(), ColorMode::kRGB, region, scale);
    const Image expected = whole.crop(region.top, region.left, region.height, region.width);
    EXPECT_EQ(std::memcmp(part.data(), expected.data(), size_t(part.height()) * part.width() * 3), 0)
        << entry["file"] << " region at 1/" << scale;
  }
}

TEST_F(ImageReference, FullScaleRegionsAreTheirPartOfTheWholeDecode) {
  for (const char* name : {"rgb420.jpg", "rgb444.jpg", "rgb422.jpg", "progressive.jpg", "gray.jpg", "cmyk.jpg", "rgb.png",
                           "palette.png"}) {
    const std::string bytes = image_bytes(name);
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    const Image whole = decode_image(data, bytes.size(), ColorMode::kRGB);
    for (const PixelRegion& region : {PixelRegion{0, 0, 1, 1}, PixelRegion{17, 9, 200, 300}, PixelRegion{1, 31, 388, 486},
                                      PixelRegion{388, 516, 1, 1}, PixelRegion{100, 0, 7, 517}}) {
      const Image part = decode_image(data, bytes.size(), ColorMode::kRGB, region);
      const Image expected = whole.crop(region.top, region.left, region.height, region.width);
      ASSERT_EQ(part.height(), region.height);
      EXPECT_EQ(std::memcmp(part.data(), expected.data(), size_t(part.height()) * part.width() * 3), 0)
          << name << " region " << region.top << "," << region.left << " " << region.height << "x" << region.width;
    }
  }
}

// Pillow refuses a truncated JPEG ("image file is truncated"); so does
// lockstep, even when the region asked for lies before the cut.
TEST_F(ImageReference, TruncatedJpegsAreRefusedWhateverTheRegion) {
  const std::string bytes = image_bytes("rgb420.jpg");
  for (double keep : {0.05, 0.5, 0.9}) {
    const std::string cut = bytes.substr(0, static_cast<size_t>(bytes.size() * keep));
    const auto* data = reinterpret_cast<const uint8_t*>(cut.data());
    for (const PixelRegion& region : {PixelRegion{0, 0, 389, 517}, PixelRegion{0, 0, 8, 8}}) {
      try {
        (void)decode_image(data, cut.size(), ColorMode::kRGB, region);
        ADD_FAILURE() << "decoded a JPEG cut at " << keep;
      } catch (const Error& error) {
        EXPECT_THAT(std::string(error.what()), ::testing::HasSubstr("truncated")) << keep;
      }
    }
  }
  const std::string png = image_bytes("rgb.png");
  for (size_t cut : {png.size() / 10, png.size() / 2, png.size() - 13}) {
    try {
      (void)decode_image(reinterpret_cast<const uint8_t*>(png.data()), cut, ColorMode::kRGB, {0, 0, 8, 8});
      ADD_FAILURE() << "decoded a PNG cut at " << cut;
    } catch (const Error& error) {
      EXPECT_THAT(std::string(error.what()), ::testing::HasSubstr("truncated")) << cut;
    }
  }
}

Image apply_op(const Image& source, const std::string& op, const nlohmann::json& p) {
  ImageSample sample(source);
  SampleRandom unused(0);
  auto interpolation = [&] { return parse_interpolation(p["interpolation"]); };
  if (op == "resized_crop") {
    const auto box = p["box"].get<std::vector<int>>();
    const auto size = p["size"].get<std::vector<int>>();
    sample.crop(box[0], box[1], box[2], box[3]);
    if (sample.height() != size[0] || sample.width() != size[1]) sample.resize(size[0], size[1], interpolation());
  } else if (op == "resize") {
    std::optional<int> max_size;
    if (p.contains("max_size")) max_size = p["max_size"].get<int>();
    Resize(p["size"].get<std::vector<int>>(), interpolation(), max_size).apply(sample, unused);
  } else if (op == "center_crop") {
    const auto size = p["size"].get<std::vector<int>>();
    CenterCrop({size[0], size[1]}).apply(sample, unused);
  } else if (op == "pad") {
    const auto pad = p["padding"].get<std::vector<int>>();
    const auto fill = p["fill"].get<std::vector<int>>();
    Pad({pad[0], pad[1], pad[2], pad[3]}, {uint8_t(fill[0]), uint8_t(fill[1]), uint8_t(fill[2])},
        parse_pad_mode(p["padding_mode"]))
        .apply(sample, unused);
  } else if (op == "hflip") {
    sample.pixels().flip_horizontal();
  } else if (op == "brightness") {
    adjust_brightness(sample.pixels(), p["factor"]);
  } else if (op == "contrast") {
    adjust_contrast(sample.pixels(), p["factor"]);
  } else if (op == "saturation") {
    adjust_saturation(sample.pixels(), p["factor"]);
  } else if (op == "hue") {
    adjust_hue(sample.pixels(), p["factor"]);
  } else {
    ADD_FAILURE() << "unknown op " << op;
  }
  return sample.take();
}

TEST_F(ImageReference, TransformsEqualTorchvisionOnFixedParameters) {
  ASSERT_GE(manifest()["op"].size(), 100u);
  for (const auto& entry : manifest()["op"]) {
    const Image source = decode(entry["file"], mode_of(entry));
    std::string detail;
    EXPECT_EQ(differences(apply_op(source, entry["op"], entry["params"]), entry, &detail), 0)
        << entry["op"] << " " << entry["params"].dump() << " on " << entry["file"] << " (" << entry["mode"]
        << "): " << detail;
  }
}

TEST_F(ImageReference, ScaledCropAndResizeEqualsPillowsDraftAndBoxResize) {
  ASSERT_GE(manifest()["scaled"].size(), 20u);
  for (const auto& entry : manifest()["scaled"]) {
    const std::string bytes = image_bytes(entry["file"]);
    const auto box = entry["box"].get<std::vector<int>>();
    const auto size = entry["size"].get<std::vector<int>>();
    ImageSample sample(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), ColorMode::kRGB);
    sample.crop(box[0], box[1], box[2], box[3]);
    sample.resize(size[0], size[1], parse_interpolation(entry["interpolation"]));
    EXPECT_EQ(sample.decode_scale(), entry["scale"].get<int>()) << entry["file"];
    std::string detail;
    EXPECT_EQ(differences(sample.take(), entry, &detail), 0)
        << entry["file"] << " box " << entry["box"].dump() << " -> " << entry["size"].dump() << " at 1/"
        << entry["scale"] << ": " << detail;
  }
}

// Pixels are those of torchvision when DCT scaling is off.
TEST_F(ImageReference, WithoutDctScalingACropAndResizeIsTorchvisionsResizedCrop) {
  for (const auto& entry : manifest()["op"]) {
    if (entry["op"] != "resized_crop" || entry["file"] != "rgb420.jpg" || entry["mode"] != "RGB") continue;
    const std::string bytes = image_bytes(entry["file"]);
    const auto box = entry["params"]["box"].get<std::vector<int>>();
    const auto size = entry["params"]["size"].get<std::vector<int>>();
    ImageSample sample(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), ColorMode::kRGB,
                       /*dct_scaling=*/false);
    sample.crop(box[0], box[1], box[2], box[3]);
    if (sample.height() != size[0] || sample.width() != size[1]) {
      sample.resize(size[0], size[1], parse_interpolation(entry["params"]["interpolation"]));
    }
    std::string detail;
    EXPECT_EQ(differences(sample.take(), entry, &detail), 0) << entry["params"].dump() << ": " << detail;
  }
}

TEST_F(ImageReference, RandomResizedCropDrawsBoxesDistributedAsTorchvisions) {
  ASSERT_EQ(manifest()["rrc"].size(), 4u);
  for (const auto& entry : manifest()["rrc"]) {
    const int height = entry["height"], width = entry["width"], draws = entry["draws"];
    const auto scale = entry["scale"].get<std::vector<double>>(), ratio = entry["ratio"].get<std::vector<double>>();
    RandomResizedCrop transform({224, 224}, {scale[0], scale[1]}, {ratio[0], ratio[1]});
    std::vector<double> sum(4, 0.0), square(4, 0.0);
    int full = 0;
    for (int i = 0; i < draws; ++i) {
      SampleRandom random(splitmix64(1000 + i));
      const CropBox box = transform.draw_box(height, width, random);
      ASSERT_TRUE(box.top >= 0 && box.left >= 0 && box.top + box.height <= height && box.left + box.width <= width);
      const double values[4] = {double(box.top), double(box.left), double(box.height), double(box.width)};
      for (int k = 0; k < 4; ++k) {
        sum[k] += values[k];
        square[k] += values[k] * values[k];
      }
      full += box.height == height && box.width == width;
    }
    const char* names[4] = {"top", "left", "height", "width"};
    for (int k = 0; k < 4; ++k) {
      const double mean = sum[k] / draws;
      const double std = std::sqrt(std::max(0.0, square[k] / draws - mean * mean));
      const double their_mean = entry["mean"][k], their_std = entry["std"][k];
      // Five standard errors of the difference of two means.
      const double tolerance = 5 * std::sqrt((std * std + their_std * their_std) / draws) + 1e-9;
      EXPECT_NEAR(mean, their_mean, tolerance) << names[k] << " of " << height << "x" << width;
      EXPECT_NEAR(std, their_std, 0.05 * their_std + 1e-9) << names[k] << " of " << height << "x" << width;
    }
    const double their_full = entry["full"];
    EXPECT_NEAR(double(full) / draws, their_full, 5 * std::sqrt(their_full * (1 - their_full) / draws) + 1e-3)
        << "share of whole-image boxes (the fallback) for " << height << "x" << width;
  }
}

}  // namespace
}  // namespace lockstep
