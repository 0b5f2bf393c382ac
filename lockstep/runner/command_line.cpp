#include "lockstep/runner/command_line.h"

#include <algorithm>
#include <iostream>

namespace lockstep {

std::string CommandLine::flag(const std::string& name, const std::string& fallback) const {
  auto found = flags.find(name);
  return found == flags.end() ? fallback : found->second;
}

std::string command_line_usage(const std::string& program, const std::vector<std::string>& program_flags) {
  std::string usage =
      "usage: " + program + " CONFIG [--set key=value]... [--work-dir DIR] [--load-from PATH] [--resume]";
  for (const auto& name : program_flags) usage += " [" + name + " VALUE]";
  return usage;
}

std::optional<CommandLine> parse_command_line(int argc, char** argv, const std::vector<std::string>& program_flags) {
  const std::string program = argc > 0 ? argv[0] : "lockstep-program";
  const auto refuse = [&](const std::string& problem) -> std::optional<CommandLine> {
    std::cerr << program << ": " << problem << "\n" << command_line_usage(program, program_flags) << "\n";
    return std::nullopt;
  };
  if (argc < 2 || std::string(argv[1]).rfind("--", 0) == 0) return refuse("the first argument names the config");
  std::vector<std::string> overrides;
  CommandLine command{Config::map(), RunnerOptions(), {}};
  for (int i = 2; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--resume") {
      command.options.resume(true);
      continue;
    }
    const bool own = std::find(program_flags.begin(), program_flags.end(), name) != program_flags.end();
    if (name != "--set" && name != "--work-dir" && name != "--load-from" && !own) {
      return refuse("unknown option '" + name + "'");
    }
    if (i + 1 >= argc) return refuse("option '" + name + "' needs a value");
    const std::string value = argv[++i];
    if (name == "--set") {
      overrides.push_back(value);
    } else if (name == "--work-dir") {
      command.options.work_dir(value);
    } else if (name == "--load-from") {
      command.options.load_from(value);
    } else {
      command.flags[name] = value;
    }
  }
  command.config = load_config(argv[1]);
  for (const auto& assignment : overrides) command.config.apply_override(assignment);
  return command;
}

}  // namespace lockstep
