// ImageFolder and ImageList: the files torchvision's ImageFolder finds, in its
// order; bad files named (or skipped and counted); batches that do not
// depend on the worker count; a resumed loader that continues bitwise.
#include "lockstep/data/image/image_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "lockstep/core/png.h"
#include "lockstep/core/read_file.h"
#include "lockstep/data/data_loader.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::lockstep::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

class ImageDatasetTest : public ::testing::Test {
 protected:
  // n PNG files of size h x w under root/<class>/, class i % 3 for file i.
  void write_pngs(const std::string& root, int n, int height = 20, int width = 24) {
    for (int c = 0; c < 3; ++c) ::mkdir((root + "/class" + std::to_string(c)).c_str(), 0755);
    torch::manual_seed(7);
    for (int i = 0; i < n; ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "/class%d/img%03d.png", i % 3, i);
      write_png(root + name, torch::randint(0, 256, {3, height, width}, torch::kUInt8));
    }
  }

  std::shared_ptr<ImageFolder> folder(const std::string& root, const std::string& pipeline_yaml,
                                      bool skip = false, bool with_path = false) {
    ImageDatasetOptions options;
    options.pipeline = ImagePipeline::build(parse_config(pipeline_yaml));
    options.skip_bad_samples = skip;
    options.with_path = with_path;
    return std::make_shared<ImageFolder>(root, options);
  }

  testing::TempDir dir_;
};

constexpr const char* kRandomPipeline =
    "- {type: RandomResizedCrop, size: [12, 16], scale: [0.3, 1.0]}\n"
    "- {type: RandomHorizontalFlip}\n"
    "- {type: ColorJitter, brightness: 0.4, contrast: 0.4, saturation: 0.4, hue: 0.1}\n";

TEST_F(ImageDatasetTest, FindsTheFilesAndClassesTorchvisionsImageFolderFinds) {
  if (!testing::python_has("torchvision")) GTEST_SKIP() << "needs python3-torchvision";
  // testdata/image_tree.py: the tree, and torchvision's ImageFolder's listing of it.
  auto made = testing::run_command(
      {testing::python(), testing::source_dir() + "/lockstep/data/image/testdata/image_tree.py", dir_.path()}, {}, 120);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto expected = nlohmann::json::parse(read_file(dir_.file("samples.json")));
  ImageFolder images(dir_.file("tree"), ImageDatasetOptions{});
  EXPECT_EQ(nlohmann::json(images.classes()), expected["classes"]);
  ASSERT_EQ(images.size(), static_cast<int64_t>(expected["samples"].size()));
  for (int64_t i = 0; i < images.size(); ++i) {
    EXPECT_EQ(images.file(i).path, expected["samples"][i][0].get<std::string>()) << i;
    EXPECT_EQ(images.file(i).label, expected["samples"][i][1].get<int64_t>()) << i;
  }
  // Mixed sizes in one batch are refused, naming both files.
  const std::string message = error_of([&] {
    ImageFolder mixed(dir_.file("tree"), ImageDatasetOptions{});
    (void)mixed.get_batch({0, 1}, 0);
  });
  EXPECT_THAT(message, AllOf(HasSubstr("different sizes"), HasSubstr("ant/"))) << message;
}

TEST_F(ImageDatasetTest, AClassFolderWithoutImagesIsAnErrorNamingIt) {
  write_pngs(dir_.path(), 3);
  ::mkdir(dir_.file("empty_class").c_str(), 0755);
  testing::write_file(dir_.file("empty_class/readme.txt"), "nothing");
  const std::string message = error_of([&] { ImageFolder images(dir_.path(), ImageDatasetOptions{}); });
  EXPECT_THAT(message, AllOf(HasSubstr("found no valid file for the classes empty_class"), HasSubstr(".png")));
}

TEST_F(ImageDatasetTest, BatchesHoldImagesLabelsAndPaths) {
  write_pngs(dir_.path(), 6);
  auto images = folder(dir_.path(), "- {type: CenterCrop, size: 10}", false, /*with_path=*/true);
  Batch batch = images->get_batch({4, 0, 2}, 0);
  EXPECT_EQ(batch.at("image").sizes(), (std::vector<int64_t>{3, 3, 10, 10}));
  EXPECT_EQ(batch.at("image").scalar_type(), torch::kUInt8);
  EXPECT_EQ(batch.at("label").scalar_type(), torch::kLong);
  const std::vector<std::string> paths = paths_of(batch.at("path"));
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[0], images->file(4).path);
  EXPECT_EQ(paths[2], images->file(2).path);
  EXPECT_EQ(batch.at("label")[0].item<int64_t>(), images->file(4).label);
  // The pixels are the file's: the PNG round trip is exact.
  const std::string bytes = read_file(images->file(0).path);
  const Image decoded = decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), ColorMode::kRGB);
  torch::Tensor chw = torch::empty({3, decoded.height(), decoded.width()}, torch::kUInt8);
  decoded.write_chw(chw.data_ptr<uint8_t>());
  EXPECT_TRUE(torch::equal(batch.at("image")[1], chw.slice(1, 5, 15).slice(2, 7, 17)));
}

TEST_F(ImageDatasetTest, GrayModeGivesOneChannel) {
  write_pngs(dir_.path(), 3);
  ImageDatasetOptions options;
  options.mode = ColorMode::kGray;
  ImageFolder images(dir_.path(), options);
  EXPECT_EQ(images.get_batch({0, 1}, 0).at("image").sizes(), (std::vector<int64_t>{2, 1, 20, 24}));
}

TEST_F(ImageDatasetTest, AnExamplesAugmentationDependsOnItsIndexAndTheEpochSeedOnly) {
  write_pngs(dir_.path(), 9);
  auto images = folder(dir_.path(), kRandomPipeline);
  const Batch together = images->get_batch({3, 5, 7}, 11);
  const Batch alone = images->get_batch({5}, 11);
  EXPECT_TRUE(torch::equal(together.at("image")[1], alone.at("image")[0]));
  EXPECT_FALSE(torch::equal(together.at("image")[1], images->get_batch({5}, 12).at("image")[0]));
}

TEST_F(ImageDatasetTest, TheSameBatchesWithOneAndThreeWorkersAndAfterAResume) {
  write_pngs(dir_.path(), 40);
  auto images = folder(dir_.path(), kRandomPipeline);
  auto sampler = std::make_shared<DefaultSampler>(images->size(), /*shuffle=*/true, /*seed=*/5);
  auto run = [&](int workers, int64_t start_batch, int count) {
    DataLoader loader(images, sampler, DataLoaderOptions().batch_size(6).num_workers(workers).seed(3));
    loader.seek(start_batch / loader.batches_per_epoch(), start_batch % loader.batches_per_epoch());
    std::vector<Batch> batches;
    for (int i = 0; i < count; ++i) batches.push_back(loader.next());
    return batches;
  };
  const std::vector<Batch> one = run(1, 0, 16);  // 7 batches per epoch: more than two epochs
  const std::vector<Batch> three = run(3, 0, 16);
  const std::vector<Batch> resumed = run(2, 9, 7);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(torch::equal(one[i].at("image"), three[i].at("image"))) << "batch " << i;
    EXPECT_TRUE(torch::equal(one[i].at("label"), three[i].at("label"))) << "batch " << i;
  }
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_TRUE(torch::equal(one[9 + i].at("image"), resumed[i].at("image"))) << "batch " << 9 + i;
  }
  // Augmentation is random: epochs differ for the same example.
  EXPECT_FALSE(torch::equal(one[0].at("image"), one[7].at("image")));
}

// Truncated, corrupt and non-image files: an error naming the file by
// default; with skip, left out of the batch, counted, and the loader's count.
TEST_F(ImageDatasetTest, BadFilesAreNamedOrSkippedAndCounted) {
  write_pngs(dir_.path(), 9);
  const std::string good_png = read_file(dir_.file("class0/img000.png"));
  std::string bad_crc = good_png;
  bad_crc[29] ^= 0x40;  // inside IHDR's CRC
  // name, contents, what the error says
  const std::vector<std::tuple<std::string, std::string, std::string>> bad = {
      {"class0/truncated.png", good_png.substr(0, good_png.size() / 2), "truncated"},
      {"class1/not_an_image.png", "hello, this is text", "not a JPEG or PNG file"},
      {"class2/empty.jpg", "", "the file is empty"},
      {"class0/truncated.jpg", std::string("\xFF\xD8\xFF\xE0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00", 20),
       "bad JPEG"},
      {"class1/bad_crc.png", bad_crc, "CRC error"},
  };
  for (const auto& [name, bytes, why] : bad) testing::write_file(dir_.file(name), bytes);

  auto strict = folder(dir_.path(), "");
  for (const auto& [name, bytes, why] : bad) {
    int64_t index = -1;
    for (int64_t i = 0; i < strict->size(); ++i) {
      if (strict->file(i).path == dir_.file(name)) index = i;
    }
    ASSERT_GE(index, 0) << name;
    const std::string message = error_of([&] { (void)strict->get_batch({index}, 0); });
    EXPECT_THAT(message, AllOf(HasSubstr("ImageFolder"), HasSubstr(dir_.file(name)), HasSubstr(why))) << message;
  }

  auto lenient = folder(dir_.path(), "", /*skip=*/true);
  std::vector<int64_t> all(lenient->size());
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(lenient->get_batch(all, 0).size(), lenient->size() - static_cast<int64_t>(bad.size()));
  EXPECT_EQ(lenient->skipped(), static_cast<int64_t>(bad.size()));

  auto sampler = std::make_shared<DefaultSampler>(lenient->size(), /*shuffle=*/false, 0);
  DataLoader loader(lenient, sampler, DataLoaderOptions().batch_size(4).num_workers(2));
  int64_t rows = 0;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) rows += loader.next().size();
  EXPECT_EQ(rows, lenient->size() - static_cast<int64_t>(bad.size()));
  EXPECT_EQ(loader.skipped_samples(), static_cast<int64_t>(bad.size()));
}

TEST_F(ImageDatasetTest, ImageListReadsPathsWithSpacesAndNamesBadLines) {
  write_pngs(dir_.path(), 3);
  ::rename(dir_.file("class1/img001.png").c_str(), dir_.file("class1/with space.png").c_str());
  testing::write_file(dir_.file("list.txt"), "class0/img000.png 4\n\nclass1/with space.png  7\r\n" +
                                                 dir_.file("class2/img002.png") + " 0\n");
  const std::vector<ImageFile> files = read_image_list(dir_.path(), dir_.file("list.txt"));
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[1].path, dir_.file("class1/with space.png"));
  EXPECT_EQ(files[1].label, 7);
  EXPECT_EQ(files[2].path, dir_.file("class2/img002.png"));

  testing::write_file(dir_.file("bad.txt"), "class0/img000.png 4\nclass1/x.png seven\n");
  EXPECT_THAT(error_of([&] { read_image_list(dir_.path(), dir_.file("bad.txt")); }),
              AllOf(HasSubstr("bad.txt:2"), HasSubstr("'seven'")));
  testing::write_file(dir_.file("nolabel.txt"), "class0/img000.png\n");
  EXPECT_THAT(error_of([&] { read_image_list(dir_.path(), dir_.file("nolabel.txt")); }),
              HasSubstr("nolabel.txt:1: expected 'path label'"));
}

TEST_F(ImageDatasetTest, ConfigErrorsNameTheKey) {
  write_pngs(dir_.path(), 3);
  auto build = [&](const std::string& yaml) {
    return error_of([&] { dataset_registry().build(parse_config(yaml, "data.yaml")); });
  };
  const std::string root = "root: " + dir_.path();
  EXPECT_THAT(build("{type: ImageFolder, " + root + ", extensions: [.bmp]}"), HasSubstr("'.bmp' is not one of"));
  EXPECT_THAT(build("{type: ImageFolder, " + root + ", mode: cmyk}"), HasSubstr("mode is rgb or gray"));
  EXPECT_THAT(build("{type: ImageFolder, " + root + ", on_bad_sample: ignore}"), HasSubstr("error or skip"));
  EXPECT_THAT(build("{type: ImageFolder, " + root + ", pipeline: [{type: RandomResizedCrop, sizee: 3}]}"),
              HasSubstr("missing key 'size'"));
  EXPECT_THAT(build("{type: ImageFolder, " + root + ", pipeline: [{type: Resize, size: 3, interpolation: area}]}"),
              HasSubstr("unknown interpolation 'area'"));
  EXPECT_THAT(build("{type: ImageFolder, " + root + ", pipeline: [{type: ColorJitter, hue: 0.7}]}"),
              HasSubstr("hue values should be between"));
  EXPECT_THAT(build("{type: ImageFolder, root: /nonexistent}"), HasSubstr("/nonexistent is not a folder"));
  EXPECT_THAT(build("{type: ImageList, list: /nonexistent.txt}"), HasSubstr("cannot open the list /nonexistent.txt"));
  // A working config builds.
  auto dataset = dataset_registry().build(
      parse_config("{type: ImageFolder, " + root + ", pipeline: [{type: Resize, size: [8, 9]}]}"));
  EXPECT_EQ(dataset->get_batch({0, 1, 2}, 0).at("image").sizes(), (std::vector<int64_t>{3, 3, 8, 9}));
}

}  // namespace
}  // namespace lockstep
