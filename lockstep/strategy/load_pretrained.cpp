#include "lockstep/strategy/load_pretrained.h"

#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"

namespace lockstep {

PretrainedReport load_pretrained(Strategy& strategy, const PretrainedOptions& options) {
  const std::string& path = options.path();
  LOCKSTEP_CHECK(!path.empty(), "load_from: no path given");
  LOCKSTEP_CHECK(std::filesystem::exists(path), "load_from: ", path, " does not exist");
  if (strategy.collectives()->is_main_process()) logger().info("Loading weights from {}", path);
  PretrainedSource source = read_pretrained(options);
  if (source.sharded_checkpoint) {
    // Each rank reads its own shard file through the strategy.
    strategy.load_sharded_weights(path, options.strict());
    return PretrainedReport();
  }
  PretrainedReport report;
  report.file_keys = source.weights.file_keys;
  // Loaded leniently first, so a strict failure can name the file keys of renamed entries too.
  report.load = strategy.load_model_state_dict(source.weights.tensors, /*strict=*/false, path);
  LOCKSTEP_CHECK(!options.strict() || report.load.clean(), "load_from (strict): cannot load the model weights from ",
                 path, ":\n", report.describe(path));
  report.loaded = source.weights.tensors.size() - report.load.unexpected.size() - report.load.mismatched.size();
  // A partial match is fine-tuning (a pretrained backbone, a new head); no
  // match at all means another model's weights (or a remapping that misses),
  // and training on would silently start from scratch.
  const bool renaming = !report.file_keys.empty() || !KeyRemap(options).identity();
  LOCKSTEP_CHECK(report.loaded > 0, "load_from: not one tensor of ", path, " fits the model: ",
                 renaming ? "the weights of another model, or a remapping that misses the model's names"
                          : "it is a checkpoint of another model",
                 ":\n", report.describe(path));
  if (strategy.collectives()->is_main_process()) {
    std::string note = report.renamed_note();
    if (!note.empty()) logger().warn("{}", note);
    logger().info("Loaded {} tensors from {} ({} renamed)", report.loaded, path, report.file_keys.size());
  }
  return report;
}

}  // namespace lockstep
