// load_pretrained: start a prepared model from pretrained weights (config
// `load_from`), through its strategy, so FSDP shards them as they load.
//
//   auto options = lockstep::PretrainedOptions().path("mlp.safetensors").strip_prefix("model.");
//   lockstep::PretrainedReport report = lockstep::load_pretrained(strategy, options);
//   for (const auto& key : report.load.missing) ...   // model keys the file did not provide
//
// Reading and remapping are checkpoint/pretrained.h's; this adds the load
// and its verdicts: strict loading, and no tensor fitting at all is an error
// (another model's weights, or a remapping that misses the model's names).
#pragma once

#include "lockstep/checkpoint/pretrained.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {

// Loads the weights into the strategy's prepared model (every rank reads the
// file). Non-strict: the report is logged as a warning and returned.
PretrainedReport load_pretrained(Strategy& strategy, const PretrainedOptions& options);

}  // namespace lockstep
