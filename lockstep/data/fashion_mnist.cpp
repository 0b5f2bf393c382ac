#include "lockstep/data/fashion_mnist.h"

#include <sys/stat.h>

#include <torch/torch.h>

#include "lockstep/data/idx_file.h"

namespace lockstep {
namespace {

bool exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

// The gzipped file, else the uncompressed one; the error names both.
std::string find_file(const std::string& root, const std::string& stem) {
  const std::string base = root + "/" + stem;
  if (exists(base + ".gz")) return base + ".gz";
  if (exists(base)) return base;
  LOCKSTEP_FAIL("FashionMNIST: missing file ", base, ".gz (nor ", base,
                " uncompressed); install the dataset with `apt-get install dataset-fashion-mnist` "
                "or set `root` to the folder holding the IDX files");
}

Batch load(const std::string& root, const std::string& split) {
  LOCKSTEP_CHECK(split == "train" || split == "test", "FashionMNIST: unknown split '", split,
                 "'; expected 'train' or 'test'");
  const std::string prefix = split == "train" ? "train" : "t10k";
  const std::string image_path = find_file(root, prefix + "-images-idx3-ubyte");
  const std::string label_path = find_file(root, prefix + "-labels-idx1-ubyte");
  torch::Tensor images = read_idx_file(image_path, kIdxImagesMagic);
  torch::Tensor labels = read_idx_file(label_path, kIdxLabelsMagic);
  LOCKSTEP_CHECK(images.size(1) == 28 && images.size(2) == 28, image_path, ": images are ", images.size(1),
                 "x", images.size(2), ", FashionMNIST images are 28x28");
  LOCKSTEP_CHECK(images.size(0) == labels.size(0), "FashionMNIST: ", image_path, " holds ", images.size(0),
                 " images but ", label_path, " holds ", labels.size(0), " labels");
  if (labels.numel() > 0) {
    const int64_t top = labels.max().item<int64_t>();
    LOCKSTEP_CHECK(top < FashionMNIST::kNumClasses, label_path, ": label ", top, " at index ",
                   labels.argmax().item<int64_t>(), " is outside 0..", FashionMNIST::kNumClasses - 1);
  }
  return Batch{{"image", images.unsqueeze(1)}, {"label", labels.to(torch::kLong)}};
}

}  // namespace

FashionMNIST::FashionMNIST(const std::string& root, const std::string& split)
    : TensorDataset(load(root, split)), split_(split) {}

LOCKSTEP_REGISTER(dataset_registry(), "FashionMNIST", [](const Config& cfg) {
  const auto split = cfg.get<std::string>("split");
  LOCKSTEP_CHECK(split == "train" || split == "test", cfg.where("split"), ": unknown FashionMNIST split '",
                 split, "'; expected 'train' or 'test'");
  const auto root = cfg.get<std::string>("root", FashionMNIST::kDefaultRoot);
  try {
    return std::make_shared<FashionMNIST>(root, split);
  } catch (const Error& error) {
    // Every remaining fault is about the files under `root`.
    LOCKSTEP_FAIL(cfg.where("root"), ": ", error.what());
  }
});

}  // namespace lockstep
