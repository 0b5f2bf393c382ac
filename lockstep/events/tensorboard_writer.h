// TensorBoardWriter: the metrics of a run as TensorBoard event files.
//
// Writes <log_dir>/events.out.tfevents.<time>.<host>, which `tensorboard
// --logdir work_dirs` reads: the scalars the EventStorage received since the
// last write (smoothed like the console and JSON writers), and the images and
// histograms put into it (which it then clears). Only rank 0 should write.
// In a config: `default_hooks: {logger: {interval: 50, tensorboard: true}}`.
//
//   auto tensorboard = std::make_shared<lockstep::TensorBoardWriter>("work_dirs/run");
//   trainer.register_hooks({std::make_shared<lockstep::PeriodicWriter>(
//       std::vector<std::shared_ptr<lockstep::EventWriter>>{tensorboard}, /*period=*/20)});
//
//   // Or by hand, like PyTorch's SummaryWriter:
//   lockstep::TensorBoardWriter writer("runs/gan");
//   writer.add_scalar("loss/generator", 0.7, /*step=*/100);
//   writer.add_image("samples", lockstep::image_grid(fake), 100);   // [C, H, W] in [0, 1]
//   writer.add_histogram("weights/fc", model->fc->weight, 100);
//
//   // Histograms of every parameter, e.g. from a hook every N iterations:
//   lockstep::put_parameter_histograms(trainer().storage(), *model);
#pragma once

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/torch.h>

#include "lockstep/events/log_processor.h"
#include "lockstep/events/event_writer.h"

namespace lockstep {

class TensorBoardWriter : public EventWriter {
 public:
  // Creates `log_dir` if needed and a new event file in it; each scalar as
  // `processor` logs it (events/log_processor.h).
  TensorBoardWriter(const std::string& log_dir, LogProcessor processor);
  // `window`: the median window of scalars put with a smoothing hint (detectron2's).
  explicit TensorBoardWriter(const std::string& log_dir, size_t window = 20);
  ~TensorBoardWriter() override;
  C10_DISABLE_COPY_AND_ASSIGN(TensorBoardWriter);

  void write(EventStorage& storage, int64_t max_iter) override;
  void close() override;

  void add_scalar(const std::string& tag, double value, int64_t step);
  // Several scalars of one step in one event.
  void add_scalars(const std::map<std::string, double>& values, int64_t step);
  // [C, H, W] (C = 1, 3 or 4) or [H, W]; uint8, or float in [0, 1]. A batch
  // [N, C, H, W] is tiled into a grid.
  void add_image(const std::string& tag, const torch::Tensor& image, int64_t step);
  void add_histogram(const std::string& tag, const torch::Tensor& values, int64_t step);

  // The event file being written.
  const std::string& path() const { return path_; }

 private:
  void append_event(const std::string& event);
  void append_summary(int64_t step, const std::vector<std::string>& values);

  std::mutex mutex_;
  std::string path_;
  LogProcessor processor_;
  std::FILE* file_ = nullptr;
  int64_t last_written_iter_ = -1;
};

// Puts a histogram of every parameter of `module` into `storage`, named
// "<prefix><parameter name>" ("params/fc.weight").
void put_parameter_histograms(EventStorage& storage, const torch::nn::Module& module,
                              const std::string& prefix = "params/");

}  // namespace lockstep
