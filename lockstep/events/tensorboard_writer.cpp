#include "lockstep/events/tensorboard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/events/tensorboard_event.h"

namespace lockstep {
namespace fs = std::filesystem;

namespace {

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// TensorFlow's name, events.out.tfevents.<seconds>.<host>; a second writer in
// the same second and directory gets a numbered suffix instead of truncating.
std::string new_event_file(const std::string& log_dir) {
  const std::string base = log_dir + "/events.out.tfevents." +
                           std::to_string(static_cast<int64_t>(wall_time_now())) + "." + host_name();
  std::string path = base;
  for (int n = 1; fs::exists(path); ++n) path = base + "." + std::to_string(n);
  return path;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir, size_t window)
    : TensorBoardWriter(log_dir, LogProcessor::detectron2(window)) {}

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir, LogProcessor processor)
    : processor_(std::move(processor)) {
  std::error_code error;
  fs::create_directories(log_dir, error);
  LOCKSTEP_CHECK(!error, "TensorBoardWriter: cannot create the log directory ", log_dir, ": ", error.message());
  path_ = new_event_file(log_dir);
  file_ = std::fopen(path_.c_str(), "wb");
  LOCKSTEP_CHECK(file_ != nullptr, "TensorBoardWriter: cannot open ", path_, ": ", std::strerror(errno));
  append_event(tensorboard::file_version_event(wall_time_now()));
}

TensorBoardWriter::~TensorBoardWriter() { close(); }

void TensorBoardWriter::append_event(const std::string& event) {
  LOCKSTEP_CHECK(file_ != nullptr, "TensorBoardWriter: ", path_, " is closed");
  const std::string record = tensorboard::tfrecord(event);
  LOCKSTEP_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(), "writing ", path_,
                 " failed: ", std::strerror(errno));
  // TensorBoard polls the file: flush every event so a live run shows up at once.
  LOCKSTEP_CHECK(std::fflush(file_) == 0, "flushing ", path_, " failed: ", std::strerror(errno));
}

void TensorBoardWriter::append_summary(int64_t step, const std::vector<std::string>& values) {
  std::vector<std::string> present;
  for (const auto& value : values) {
    if (!value.empty()) present.push_back(value);
  }
  if (present.empty()) return;
  append_event(tensorboard::summary_event(wall_time_now(), step, present));
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  add_scalars({{tag, value}}, step);
}

void TensorBoardWriter::add_scalars(const std::map<std::string, double>& values, int64_t step) {
  std::vector<std::string> encoded;
  for (const auto& [tag, value] : values) encoded.push_back(tensorboard::scalar_value(tag, value));
  std::lock_guard<std::mutex> lock(mutex_);
  append_summary(step, encoded);
}

void TensorBoardWriter::add_image(const std::string& tag, const torch::Tensor& image, int64_t step) {
  std::string encoded = tensorboard::image_value(tag, image);
  std::lock_guard<std::mutex> lock(mutex_);
  append_summary(step, {encoded});
}

void TensorBoardWriter::add_histogram(const std::string& tag, const torch::Tensor& values, int64_t step) {
  std::string encoded = tensorboard::histogram_value(tag, values);
  if (encoded.empty()) logger().warn("TensorBoard histogram '{}' at step {} has no finite value; skipped", tag, step);
  std::lock_guard<std::mutex> lock(mutex_);
  append_summary(step, {encoded});
}

void TensorBoardWriter::write(EventStorage& storage, int64_t /*max_iter*/) {
  if (file_ == nullptr) return;
  // Scalars recorded since the previous write, one event per iteration (a
  // final evaluation lands at its own step, like in the JSON writer).
  std::map<int64_t, std::map<std::string, double>> by_iteration;
  for (const auto& [name, event] : processor_.summarize(storage)) {
    if (event.iteration > last_written_iter_) by_iteration[event.iteration][name] = event.value;
  }
  for (const auto& [iteration, scalars] : by_iteration) {
    add_scalars(scalars, iteration);
    last_written_iter_ = std::max(last_written_iter_, iteration);
  }
  for (const auto& image : storage.images()) add_image(image.name, image.image, image.iteration);
  storage.clear_images();
  for (const auto& histogram : storage.histograms()) add_histogram(histogram.name, histogram.values, histogram.iteration);
  storage.clear_histograms();
}

void TensorBoardWriter::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
}

void put_parameter_histograms(EventStorage& storage, const torch::nn::Module& module, const std::string& prefix) {
  for (const auto& item : module.named_parameters()) storage.put_histogram(prefix + item.key(), item.value());
}

}  // namespace lockstep
