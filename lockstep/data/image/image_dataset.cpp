#include "lockstep/data/image/image_dataset.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <set>

#include <torch/torch.h>

#include "lockstep/core/logging.h"
#include "lockstep/core/read_file.h"

namespace lockstep {
namespace {

// Python's os.path.join for the simple case: one separator between.
std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string strip_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool has_extension(const std::string& name, const std::vector<std::string>& extensions) {
  const std::string low = lower(name);
  for (const std::string& extension : extensions) {
    if (low.size() >= extension.size() && low.compare(low.size() - extension.size(), extension.size(), extension) == 0) {
      return true;
    }
  }
  return false;
}

// Entries of `dir` split into folders and the rest, following links as
// os.scandir().is_dir() and os.walk(followlinks=True) do.
void list_dir(const std::string& dir, std::vector<std::string>* folders, std::vector<std::string>* others) {
  DIR* handle = ::opendir(dir.c_str());
  LOCKSTEP_CHECK(handle != nullptr, dir, ": cannot list (", std::strerror(errno), ")");
  while (dirent* entry = ::readdir(handle)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat info;
    const bool is_dir = ::stat(join_path(dir, name).c_str(), &info) == 0 && S_ISDIR(info.st_mode);
    (is_dir ? folders : others)->push_back(name);
  }
  ::closedir(handle);
}

// os.walk(top, followlinks=True) as (dirpath, filenames), each folder once
// (a link cycle is not followed twice).
void walk(const std::string& top, std::set<std::pair<dev_t, ino_t>>* seen,
          std::vector<std::pair<std::string, std::vector<std::string>>>* out) {
  struct stat info;
  if (::stat(top.c_str(), &info) != 0 || !seen->insert({info.st_dev, info.st_ino}).second) return;
  std::vector<std::string> folders, files;
  list_dir(top, &folders, &files);
  out->emplace_back(top, std::move(files));
  for (const std::string& folder : folders) walk(join_path(top, folder), seen, out);
}

std::string extension_list(const std::vector<std::string>& extensions) {
  std::string text;
  for (const std::string& extension : extensions) text += (text.empty() ? "" : ", ") + extension;
  return text;
}

[[noreturn]] void fail_bad_sample(const std::string& kind, const ImageFile& file, const std::string& why) {
  LOCKSTEP_FAIL(kind, ": ", file.path, ": ", why);
}

}  // namespace

ImageFileDataset::ImageFileDataset(std::string kind, std::vector<ImageFile> files, ImageDatasetOptions options)
    : kind_(std::move(kind)), files_(std::move(files)), options_(std::move(options)) {
  for (const ImageFile& file : files_) longest_path_ = std::max<int64_t>(longest_path_, file.path.size());
}

const ImageFile& ImageFileDataset::file(int64_t index) const {
  LOCKSTEP_CHECK(index >= 0 && index < size(), kind_, ": index ", index, " is out of range for ", size(), " files");
  return files_[index];
}

Image ImageFileDataset::load(int64_t index, uint64_t seed) const {
  const ImageFile& entry = file(index);
  std::string bytes;
  try {
    bytes = read_file(entry.path);
  } catch (const Error& error) {
    LOCKSTEP_FAIL(kind_, ": ", error.what());
  }
  try {
    ImageSample sample(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), options_.mode,
                       options_.dct_scaling);
    return options_.pipeline.run(sample, seed);
  } catch (const Error& error) {
    fail_bad_sample(kind_, entry, error.what());
  }
}

Batch ImageFileDataset::get_batch(const std::vector<int64_t>& indices, uint64_t seed) const {
  std::vector<Image> images;
  std::vector<int64_t> kept;
  images.reserve(indices.size());
  for (int64_t index : indices) {
    try {
      images.push_back(load(index, example_seed(seed, index)));
      kept.push_back(index);
    } catch (const Error& error) {
      if (!options_.skip_bad_samples || index < 0 || index >= size()) throw;
      ++skipped_;
      logger().warn("skipping an unreadable example (on_bad_sample: skip): {}", error.what());
    }
  }
  LOCKSTEP_CHECK(!images.empty() || indices.empty(), kind_, ": every one of the ", indices.size(),
                 " files of this batch is unreadable, the first ", files_[indices.front()].path);
  const int64_t n = static_cast<int64_t>(images.size());
  const int64_t channels = channels_of(options_.mode);
  if (n == 0) return Batch{{"image", torch::empty({0, channels, 0, 0}, torch::kUInt8)}, {"label", torch::empty({0}, torch::kLong)}};
  const Image& first = images.front();
  for (int64_t i = 1; i < n; ++i) {
    const Image& image = images[i];
    LOCKSTEP_CHECK(image.height() == first.height() && image.width() == first.width(), kind_,
                   ": images of different sizes in one batch: ", files_[kept[0]].path, " gives ", first.channels(),
                   "x", first.height(), "x", first.width(), " but ", files_[kept[i]].path, " gives ",
                   image.channels(), "x", image.height(), "x", image.width(),
                   "; end the pipeline with a fixed size (Resize to [h, w], CenterCrop or RandomResizedCrop)");
  }
  torch::Tensor pixels = torch::empty({n, channels, first.height(), first.width()}, torch::kUInt8);
  torch::Tensor labels = torch::empty({n}, torch::kLong);
  const int64_t plane_bytes = channels * first.height() * first.width();
  for (int64_t i = 0; i < n; ++i) {
    images[i].write_chw(pixels.data_ptr<uint8_t>() + i * plane_bytes);
    labels.data_ptr<int64_t>()[i] = files_[kept[i]].label;
  }
  Batch batch{{"image", pixels}, {"label", labels}};
  if (options_.with_path) {
    torch::Tensor paths = torch::zeros({n, std::max<int64_t>(longest_path_, 1)}, torch::kUInt8);
    for (int64_t i = 0; i < n; ++i) {
      const std::string& path = files_[kept[i]].path;
      std::memcpy(paths.data_ptr<uint8_t>() + i * paths.size(1), path.data(), path.size());
    }
    batch.set("path", paths);
  }
  return batch;
}

std::pair<std::vector<std::string>, std::vector<ImageFile>> scan_image_folder(
    const std::string& root_path, const std::vector<std::string>& extensions) {
  const std::string root = strip_trailing_slashes(root_path);
  struct stat info;
  LOCKSTEP_CHECK(::stat(root.c_str(), &info) == 0 && S_ISDIR(info.st_mode), "ImageFolder: root ", root,
                 " is not a folder");
  std::vector<std::string> classes, others;
  list_dir(root, &classes, &others);
  std::sort(classes.begin(), classes.end());
  LOCKSTEP_CHECK(!classes.empty(), "ImageFolder: couldn't find any class folder in ", root);
  std::vector<ImageFile> files;
  std::vector<std::string> empty_classes;
  for (size_t label = 0; label < classes.size(); ++label) {
    std::set<std::pair<dev_t, ino_t>> seen;
    std::vector<std::pair<std::string, std::vector<std::string>>> folders;
    walk(join_path(root, classes[label]), &seen, &folders);
    std::sort(folders.begin(), folders.end());
    const size_t before = files.size();
    for (auto& [dir, names] : folders) {
      std::sort(names.begin(), names.end());
      for (const std::string& name : names) {
        if (has_extension(name, extensions)) files.push_back({join_path(dir, name), static_cast<int64_t>(label)});
      }
    }
    if (files.size() == before) empty_classes.push_back(classes[label]);
  }
  if (!empty_classes.empty()) {
    LOCKSTEP_FAIL("ImageFolder: ", root, ": found no valid file for the classes ", extension_list(empty_classes),
                  "; supported extensions are: ", extension_list(extensions));
  }
  return {std::move(classes), std::move(files)};
}

ImageFolder::ImageFolder(const std::string& root, ImageDatasetOptions options, const std::vector<std::string>& extensions)
    : ImageFolder(scan_image_folder(root, extensions), std::move(options)) {}

ImageFolder::ImageFolder(std::pair<std::vector<std::string>, std::vector<ImageFile>> found, ImageDatasetOptions options)
    : ImageFileDataset("ImageFolder", std::move(found.second), std::move(options)), classes_(std::move(found.first)) {}

std::vector<ImageFile> read_image_list(const std::string& root, const std::string& list) {
  std::ifstream in(list);
  LOCKSTEP_CHECK(in.good(), "ImageList: cannot open the list ", list, " (", std::strerror(errno), ")");
  std::vector<ImageFile> files;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    line = line.substr(start);
    const size_t split = line.find_last_of(" \t");
    LOCKSTEP_CHECK(split != std::string::npos, list, ":", number, ": expected 'path label', got '", line, "'");
    const std::string path = line.substr(0, line.find_last_not_of(" \t", split) + 1);
    const std::string label_text = line.substr(split + 1);
    int64_t label = -1;
    size_t used = 0;
    try {
      label = std::stoll(label_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOCKSTEP_CHECK(used == label_text.size() && label >= 0, list, ":", number, ": the label '", label_text,
                   "' is not a non-negative integer");
    files.push_back({path.front() == '/' ? path : join_path(root, path), label});
  }
  LOCKSTEP_CHECK(!files.empty(), "ImageList: ", list, " lists no files");
  return files;
}

std::vector<std::string> paths_of(const torch::Tensor& path_bytes) {
  LOCKSTEP_CHECK(path_bytes.dim() == 2 && path_bytes.scalar_type() == torch::kUInt8,
                 "paths_of: expected the uint8 [N, L] `path` tensor of an image dataset");
  const torch::Tensor bytes = path_bytes.cpu().contiguous();
  std::vector<std::string> paths;
  for (int64_t i = 0; i < bytes.size(0); ++i) {
    const char* row = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>() + i * bytes.size(1));
    paths.emplace_back(row, strnlen(row, bytes.size(1)));
  }
  return paths;
}

// ---- config -------------------------------------------------------------

namespace {

ImageDatasetOptions read_options(const Config& cfg) {
  ImageDatasetOptions options;
  const auto mode = cfg.get<std::string>("mode", "rgb");
  LOCKSTEP_CHECK(mode == "rgb" || mode == "gray", cfg.where("mode"), ": mode is rgb or gray, got '", mode, "'");
  options.mode = mode == "rgb" ? ColorMode::kRGB : ColorMode::kGray;
  options.pipeline = ImagePipeline::build(cfg.child("pipeline"));
  const auto on_bad = cfg.get<std::string>("on_bad_sample", "error");
  LOCKSTEP_CHECK(on_bad == "error" || on_bad == "skip", cfg.where("on_bad_sample"),
                 ": on_bad_sample is error or skip, got '", on_bad, "'");
  options.skip_bad_samples = on_bad == "skip";
  options.with_path = cfg.get<bool>("with_path", false);
  options.dct_scaling = cfg.get<bool>("dct_scaling", true);
  return options;
}

}  // namespace

LOCKSTEP_REGISTER(dataset_registry(), "ImageFolder", [](const Config& cfg) {
  auto extensions = cfg.get<std::vector<std::string>>("extensions", ImageFolder::default_extensions());
  for (std::string& extension : extensions) {
    extension = lower(extension);
    LOCKSTEP_CHECK(extension == ".jpg" || extension == ".jpeg" || extension == ".png", cfg.where("extensions"),
                   ": lockstep decodes JPEG and PNG files; '", extension, "' is not one of .jpg, .jpeg, .png");
  }
  ImageDatasetOptions options = read_options(cfg);
  const auto root = cfg.get<std::string>("root");
  try {
    return std::make_shared<ImageFolder>(root, std::move(options), extensions);
  } catch (const Error& error) {
    LOCKSTEP_FAIL(cfg.where("root"), ": ", error.what());
  }
});

LOCKSTEP_REGISTER(dataset_registry(), "ImageList", [](const Config& cfg) {
  ImageDatasetOptions options = read_options(cfg);
  const auto root = cfg.get<std::string>("root", "");
  const auto list = cfg.get<std::string>("list");
  std::vector<ImageFile> files;
  try {
    files = read_image_list(root, list);
  } catch (const Error& error) {
    LOCKSTEP_FAIL(cfg.where("list"), ": ", error.what());
  }
  return std::make_shared<ImageFileDataset>("ImageList", std::move(files), std::move(options));
});

}  // namespace lockstep
