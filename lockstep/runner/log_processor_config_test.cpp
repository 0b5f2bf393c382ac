#include "lockstep/runner/log_processor_config.h"

#include <gtest/gtest.h>

#include <string>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// The message parse_log_processor fails with for `yaml`, or "" if it passes.
std::string error_of(const std::string& yaml) {
  try {
    parse_log_processor(parse_config(yaml, "cfg.yaml").child("log_processor"));
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(LogProcessorConfig, WithoutTheSectionMmenginesDefaults) {
  const LogProcessor processor = parse_log_processor(Config());
  EXPECT_TRUE(processor.logs_main_rank_values());
  EXPECT_EQ(processor.window(), 10u);
}

TEST(LogProcessorConfig, MmenginesKeysAreRead) {
  const Config config = parse_config(
      "log_processor:\n  type: LogProcessor\n  window_size: 50\n  by_epoch: true\n  num_digits: 4\n"
      "  custom_cfg:\n    - {data_src: loss, log_name: loss_max, method_name: max, window_size: global}\n",
      "cfg.yaml");
  const LogProcessor processor = parse_log_processor(config.child("log_processor"));
  EXPECT_EQ(processor.window(), 50u);
  EventStorage storage;
  storage.put_scalar("loss", 3.0, true, 0);
  storage.put_scalar("loss", 1.0, true, 1);
  EXPECT_EQ(processor.summarize(storage).at("loss_max").value, 3.0);
}

TEST(LogProcessorConfig, Detectron2sIsATypeOfItsOwn) {
  const Config config = parse_config("log_processor: {type: Detectron2LogProcessor, window_size: 20}\n", "cfg.yaml");
  const LogProcessor processor = parse_log_processor(config.child("log_processor"));
  EXPECT_FALSE(processor.logs_main_rank_values());
  EXPECT_EQ(processor.window(), 20u);
}

TEST(LogProcessorConfig, BadKeysFailNamingFileLineAndKey) {
  EXPECT_NE(error_of("log_processor: {window_size: 0}\n").find("cfg.yaml:1"), std::string::npos);
  EXPECT_NE(error_of("log_processor: {window_size: 0}\n").find("window_size must be at least 1"), std::string::npos);
  EXPECT_NE(error_of("log_processor: {type: Printer}\n").find("log_processor type 'Printer' is neither"),
            std::string::npos);
  EXPECT_NE(error_of("log_processor: {windw_size: 5}\n").find("windw_size"), std::string::npos);
  EXPECT_NE(error_of("log_processor: {mean_pattern: '(loss'}\n").find("is not a regular expression"),
            std::string::npos);
  EXPECT_NE(error_of("log_processor:\n  custom_cfg:\n    - {data_src: loss, method_name: median}\n")
                .find("cfg.yaml:3"),
            std::string::npos);
  EXPECT_NE(error_of("log_processor:\n  custom_cfg:\n    - {data_src: loss, window_size: epoch}\n")
                .find("window_size: epoch"),
            std::string::npos);
  EXPECT_NE(error_of("log_processor:\n  custom_cfg:\n    - {data_src: loss}\n    - {data_src: loss}\n")
                .find("logs 'loss' twice"),
            std::string::npos);
  EXPECT_NE(error_of("log_processor: {log_with_hierarchy: true}\n").find("not supported"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
