#include "apps/lockstep/plot_command.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"
#include "apps/lockstep/curve_plot.h"

extern char** environ;

namespace lockstep::cli {
namespace {

struct PlotArguments {
  std::vector<std::string> work_dirs;
  std::vector<std::string> keys;
  std::string x_axis = "iteration";
  int64_t smooth = 1;
  std::string out = "curves.svg";
  bool png = false;
  std::string title;
};

// The first executable called `name` in $PATH's folders; empty when there is none.
std::string executable_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream folders(path != nullptr ? path : "");
  std::string folder;
  while (std::getline(folders, folder, ':')) {
    const std::string candidate = (folder.empty() ? "." : folder) + "/" + name;
    std::error_code error;
    if (access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate, error)) return candidate;
  }
  return "";
}

// Runs `argv` (argv[0] a path) and waits; "" when it exits 0, else what went wrong.
std::string run_to_completion(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ);
  if (spawned != 0) return str_cat("cannot run it: ", std::strerror(spawned));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return str_cat("waiting for it failed: ", std::strerror(errno));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return WIFEXITED(status) ? str_cat("exit status ", WEXITSTATUS(status)) : str_cat("signal ", WTERMSIG(status));
}

// Draws `svg` as the PNG beside it (same name, .png) with rsvg-convert; returns the PNG's path.
std::string convert_svg_to_png(const std::string& svg) {
  const std::string png = std::filesystem::path(svg).replace_extension(".png").string();
  const std::string converter = executable_on_path("rsvg-convert");
  LOCKSTEP_CHECK(!converter.empty(),
                 "--png needs rsvg-convert, which is not on PATH (Debian package librsvg2-bin: "
                 "apt-get install librsvg2-bin); the SVG was written to ",
                 svg);
  const std::string failure = run_to_completion({converter, "-o", png, svg});
  LOCKSTEP_CHECK(failure.empty(), "--png: `rsvg-convert -o ", png, " ", svg, "` failed (", failure,
                 "); the SVG was written to ", svg);
  return png;
}

size_t distinct(const std::vector<CurveSeries>& series, std::string CurveSeries::*field) {
  std::set<std::string> values;
  for (const auto& one : series) values.insert(one.*field);
  return values.size();
}

void run_plot(const PlotArguments& args) {
  const CurvePlotOptions options =
      CurvePlotOptions().keys(args.keys).x_axis(args.x_axis).smooth(args.smooth).title(args.title);
  const std::vector<CurveSeries> series = read_metrics_curves(args.work_dirs, options);
  write_file_atomically(args.out, render_curves_svg(series, options));
  const size_t keys = distinct(series, &CurveSeries::key), runs = distinct(series, &CurveSeries::run);
  std::cout << "Wrote " << args.out << " (" << keys << (keys == 1 ? " key, " : " keys, ") << runs
            << (runs == 1 ? " run)" : " runs)") << std::endl;
  if (args.png) {
    const std::string png = convert_svg_to_png(args.out);
    std::cout << "Wrote " << png << std::endl;
  }
}

}  // namespace

CLI::App* add_plot_command(CLI::App& app) {
  auto args = std::make_shared<PlotArguments>();
  CLI::App* plot = app.add_subcommand(
      "plot", "Draw training curves from runs' metrics.jsonl as an SVG: a panel per key, a curve per run");
  plot->add_option("work_dirs", args->work_dirs, "Work dirs of runs (or their metrics.jsonl files)")->required();
  plot->add_option("--keys", args->keys,
                   "Keys to plot, comma-separated (default: every key but iteration, epoch, data_time, time, "
                   "eta_seconds)")
      ->delimiter(',')
      ->allow_extra_args(false);
  plot->add_option("--x", args->x_axis, "The x axis: iteration, or epoch (the lines' \"epoch\")")->capture_default_str();
  plot->add_option("--smooth", args->smooth, "Moving average over the last K points (1: none)")->capture_default_str();
  plot->add_option("-o,--output", args->out, "The SVG file to write")->capture_default_str();
  plot->add_flag("--png", args->png, "Also write a PNG beside the SVG (needs rsvg-convert, Debian's librsvg2-bin)");
  plot->add_option("--title", args->title, "A heading above the panels");
  plot->callback([args]() { run_plot(*args); });
  return plot;
}

}  // namespace lockstep::cli
