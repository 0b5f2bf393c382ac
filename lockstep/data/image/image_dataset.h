// Datasets of image files: ImageFolder (one folder per class) and ImageList
// (a list file of "relative/path label" lines), decoded and augmented in the
// loader's worker threads.
//
//   # config
//   train_dataloader:
//     batch_size: 64
//     num_workers: 2
//     sampler: {type: DefaultSampler, shuffle: true}
//     dataset:
//       type: ImageFolder
//       root: data/train              # data/train/<class>/**/<file>.jpg
//       mode: rgb                     # or gray
//       extensions: [.jpg, .jpeg, .png]
//       pipeline:
//         - {type: RandomResizedCrop, size: 224}
//         - {type: RandomHorizontalFlip}
//       on_bad_sample: error          # or skip
//       with_path: false
//
//   lockstep::ImageFolder train("data/train", options);
//   train.classes();                  // sorted class folder names; label = position
//   lockstep::Batch b = train.get_batch({0, 5}, seed);
//   b.at("image");                    // uint8 [2, 3, 224, 224]
//   b.at("label");                    // int64 [2]
//
// Files and classes are found as torchvision's ImageFolder finds them: class
// folders sorted by name, each walked recursively (following links) with
// folders and then files in sorted order, files kept by extension (case
// insensitive). Each example draws its augmentation from (seed, epoch,
// index) (SeedScope::kEpoch), so batches do not depend on the worker count.
// A file that cannot be read or decoded is an error naming it; with
// `on_bad_sample: skip` it is left out of its batch with a warning, and the
// loader logs each epoch's count. `with_path: true` adds `path`: each file's
// path as UTF-8 bytes, zero-padded to the longest path (paths_of() reads them).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"
#include "lockstep/data/image/transforms.h"

namespace lockstep {

struct ImageFile {
  std::string path;
  int64_t label = 0;
};

struct ImageDatasetOptions {
  ColorMode mode = ColorMode::kRGB;
  ImagePipeline pipeline;
  bool skip_bad_samples = false;  // on_bad_sample: skip
  bool with_path = false;
  // Decode JPEGs at 1/2, 1/4 or 1/8 scale where a resize shrinks them that far
  // (Pillow's draft()); false decodes every pixel, as torchvision does.
  bool dct_scaling = true;
};

class ImageFileDataset : public Dataset {
 public:
  // `kind` names the dataset in messages ("ImageFolder").
  ImageFileDataset(std::string kind, std::vector<ImageFile> files, ImageDatasetOptions options);

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override;
  SeedScope seed_scope() const override { return SeedScope::kEpoch; }

  const ImageFile& file(int64_t index) const;
  const std::vector<ImageFile>& files() const { return files_; }
  // One example through the pipeline, drawing from SampleRandom(seed).
  Image load(int64_t index, uint64_t seed) const;
  // Examples skipped as unreadable since construction.
  int64_t skipped() const { return skipped_.load(); }

 private:
  std::string kind_;
  std::vector<ImageFile> files_;
  ImageDatasetOptions options_;
  int64_t longest_path_ = 0;
  mutable std::atomic<int64_t> skipped_{0};
};

class ImageFolder : public ImageFileDataset {
 public:
  static std::vector<std::string> default_extensions() { return {".jpg", ".jpeg", ".png"}; }
  ImageFolder(const std::string& root, ImageDatasetOptions options,
              const std::vector<std::string>& extensions = default_extensions());
  const std::vector<std::string>& classes() const { return classes_; }

 private:
  ImageFolder(std::pair<std::vector<std::string>, std::vector<ImageFile>> found, ImageDatasetOptions options);
  std::vector<std::string> classes_;
};

// torchvision's find_classes + make_dataset: the sorted class folders of
// `root` and the files under each, in ImageFolder's order.
std::pair<std::vector<std::string>, std::vector<ImageFile>> scan_image_folder(
    const std::string& root, const std::vector<std::string>& extensions);

// The files of an ImageList: each non-empty line of `list` is
// "path label", split at its last space; a relative path is under `root`.
std::vector<ImageFile> read_image_list(const std::string& root, const std::string& list);

// The paths of a batch's `path` tensor (with_path: true).
std::vector<std::string> paths_of(const torch::Tensor& path_bytes);

}  // namespace lockstep
