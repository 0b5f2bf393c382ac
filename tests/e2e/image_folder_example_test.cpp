// examples/image_folder end to end: write_png_folders.py writes Fashion-MNIST
// as PNG class folders whose pixels and labels are the IDX files' own, and
// `lockstep train --nproc 2` learns from them through ImageFolder (one epoch
// over every third training image here, all ten classes; three epochs over
// all of them reach the IDX demo's accuracy, see README).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/data/fashion_mnist.h"
#include "lockstep/data/image/image_dataset.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

TEST(ImageFolderExample, PngFoldersHoldTheIdxImagesAndTrainOnTwoRanks) {
  if (!testing::python_has("PIL")) GTEST_SKIP() << "needs python3-pil";
  testing::TempDir dir;
  const std::string example = testing::source_dir() + "/examples/image_folder/";
  auto written = testing::run_command({testing::python(), example + "write_png_folders.py", dir.file("png"), "--train-every", "3"}, {},
                                      300);
  ASSERT_EQ(written.exit_code, 0) << written.output;

  // Every test image and label, through ImageFolder, equals the IDX file's.
  ImageDatasetOptions gray;
  gray.mode = ColorMode::kGray;
  ImageFolder folder(dir.file("png/test"), gray);
  FashionMNIST idx(FashionMNIST::kDefaultRoot, "test");
  ASSERT_EQ(folder.size(), idx.size());
  std::vector<int64_t> all(folder.size()), idx_order(folder.size());
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = 0; i < folder.size(); ++i) {
    const std::string& path = folder.file(i).path;
    idx_order[i] = std::stoll(path.substr(path.rfind('/') + 1));  // <index>.png
  }
  const Batch from_png = folder.get_batch(all, 0);
  const Batch from_idx = idx.get_batch(idx_order, 0);
  EXPECT_TRUE(torch::equal(from_png.at("image"), from_idx.at("image")));
  EXPECT_TRUE(torch::equal(from_png.at("label"), from_idx.at("label")));

  auto trained = testing::run_command(
      {testing::lockstep_binary(), "train", example + "cnn_ddp.yaml", "--nproc", "2", "--work-dir", dir.file("run"),
       "--set", "train_dataloader.dataset.root=" + dir.file("png/train"), "--set",
       "val_dataloader.dataset.root=" + dir.file("png/test"), "--set", "test_dataloader.dataset.root=" + dir.file("png/test"),
       "--set", "train_cfg.max_epochs=1", "--set", "param_scheduler.1.end=1", "--set", "param_scheduler.1.T_max=1"},
      {}, 600);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_GT(testing::number_after(trained.output, "Final test accuracy/top1: "), 0.85) << trained.output;
}

}  // namespace
}  // namespace lockstep
