#include "lockstep/hooks/periodic_writer.h"

#include "lockstep/core/error.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/events/console_writer.h"
#include "lockstep/events/json_writer.h"
#include "lockstep/events/tensorboard_writer.h"

namespace lockstep {

PeriodicWriter::PeriodicWriter(std::vector<std::shared_ptr<EventWriter>> writers, int64_t period)
    : Hook("PeriodicWriter"), writers_(std::move(writers)), period_(period) {
  LOCKSTEP_CHECK(period_ >= 1, "PeriodicWriter period must be at least 1, got ", period_);
}

void PeriodicWriter::after_step() {
  const int64_t iteration = trainer().iter();
  if ((iteration + 1) % period_ == 0 || iteration == trainer().max_iter() - 1) {
    for (auto& writer : writers_) writer->write(trainer().storage(), trainer().max_iter());
  }
}

void PeriodicWriter::after_train() {
  for (auto& writer : writers_) {
    // The final write publishes whatever after_train hooks before us recorded (the final eval).
    writer->write(trainer().storage(), trainer().max_iter());
    writer->close();
  }
}

namespace {
// interval (iterations), tensorboard (event files too); the numbers are the
// run's log_processor's. Only rank 0 writes: the others get a writer with
// nothing to write to.
std::shared_ptr<Hook> build_periodic_writer(const Config& config, const HookContext& context) {
  const int64_t interval = config.get<int64_t>("interval", 20);
  LOCKSTEP_CHECK(interval >= 1, config.where("interval"), ": interval must be at least 1, got ", interval);
  LOCKSTEP_CHECK(!config.has("window"), config.where("window"),
                 ": the logger's window is now the log processor's: log_processor: {window_size: N}");
  const bool tensorboard = config.get<bool>("tensorboard", false);
  std::vector<std::shared_ptr<EventWriter>> writers;
  if (context.collectives->is_main_process()) {
    writers.push_back(std::make_shared<ConsoleWriter>(context.log_processor));
    writers.push_back(std::make_shared<JsonWriter>(context.work_dir + "/metrics.jsonl", context.log_processor));
    if (tensorboard) writers.push_back(std::make_shared<TensorBoardWriter>(context.work_dir, context.log_processor));
  }
  return std::make_shared<PeriodicWriter>(std::move(writers), interval);
}
}  // namespace

// mmengine calls it LoggerHook.
LOCKSTEP_REGISTER(hook_registry(), "PeriodicWriter", build_periodic_writer);
LOCKSTEP_REGISTER(hook_registry(), "LoggerHook", build_periodic_writer);

}  // namespace lockstep
