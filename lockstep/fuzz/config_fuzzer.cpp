// Fuzzes the YAML config parser and what reads it: parse, the typed getters
// the runner uses, `--set` overrides and dumping back to YAML. Bad input must
// end in lockstep::Error; anything else (a crash, a sanitizer report, another
// exception type escaping) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first line, when it holds '=', is also tried as a --set override.
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    lockstep::Config config = lockstep::parse_config(text, "fuzz.yaml");
    const size_t newline = text.find('\n');
    const std::string first_line = text.substr(0, newline);
    if (first_line.find('=') != std::string::npos) {
      try {
        config.apply_override(first_line);
      } catch (const lockstep::Error&) {
      }
    }
    for (const char* key : {"model", "train_cfg", "optim_wrapper", "default_hooks"}) {
      if (!config.has(key)) continue;
      lockstep::Config child = config.child(key);
      try {
        (void)child.get<std::string>("type", "");
        (void)child.get<int64_t>("max_iters", 0);
        (void)child.get<double>("lr", 0.0);
        (void)child.get<bool>("by_epoch", false);
        (void)child.where("type");
      } catch (const lockstep::Error&) {
      }
    }
    (void)lockstep::parse_config(config.to_yaml(), "dumped.yaml");
  } catch (const lockstep::Error&) {
  }
  return 0;
}
