// The command line of a program that trains one config, as `lockstep train`
// reads it (detectron2's default_argument_parser, for C++ programs that
// register their own models and then hand a config to a Runner):
//
//   PROGRAM CONFIG [--set key=value]... [--work-dir DIR] [--load-from PATH] [--resume]
//           [--<program's own flag> VALUE]...
//
//   int main(int argc, char** argv) {
//     auto command = lockstep::parse_command_line(argc, argv, {"--sample-chars"});
//     if (!command) return 2;  // the usage line went to stderr
//     lockstep::Runner runner(command->config, command->options);
//     int64_t chars = std::stoll(command->flag("--sample-chars", "400"));
//     ...
//   }
//
// --set applies a `lockstep train --set` override to the config; --work-dir,
// --load-from and --resume set the RunnerOptions of the same names.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/runner/runner.h"

namespace lockstep {

struct CommandLine {
  Config config;          // CONFIG, with every --set applied in order
  RunnerOptions options;  // --work-dir, --load-from, --resume
  // The program's own flags as given ("--sample-chars" -> "200").
  std::map<std::string, std::string> flags;

  // The value of the program's flag `name`, or `fallback` when absent.
  std::string flag(const std::string& name, const std::string& fallback) const;
};

// The usage line for `program` with the program's own flags.
std::string command_line_usage(const std::string& program, const std::vector<std::string>& program_flags);

// Parses argv; `program_flags` are the flags (each taking a value) the
// program reads itself. An unknown or incomplete flag, or no CONFIG, prints
// the problem and the usage line to stderr and returns nullopt. A config that
// does not load throws lockstep::Error naming its file and line, as
// load_config does.
std::optional<CommandLine> parse_command_line(int argc, char** argv,
                                              const std::vector<std::string>& program_flags = {});

}  // namespace lockstep
