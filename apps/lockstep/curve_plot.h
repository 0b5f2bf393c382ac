// Training curves from metrics.jsonl as an SVG: what `lockstep plot` draws
// (mmengine's `analyze_logs.py plot_curve`, with no Python or TensorBoard).
//
// read_metrics_curves reads the JsonWriter's metrics.jsonl of one or more runs
// (a work dir, or the file itself), keeps the last line of an iteration a
// resumed run wrote twice, and returns one series per (key, run);
// render_curves_svg draws one panel per key, one curve per run, with nice
// ticks, a legend and an optional moving average.
//
//   auto options = lockstep::CurvePlotOptions().keys({"loss", "accuracy/top1"}).smooth(5);
//   auto series = lockstep::read_metrics_curves({"work_dirs/a", "work_dirs/b"}, options);
//   lockstep::write_file_atomically("curves.svg", lockstep::render_curves_svg(series, options));
//
// Every curve is a <path class="curve" data-key="loss" data-run="a" data-points="42">,
// data-points counting the finite points drawn.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/arg.h>

namespace lockstep {

struct CurvePlotOptions {
  // The keys to plot, one panel each, in this order. Empty: every scalar key
  // but the bookkeeping ones (curve_bookkeeping_keys()), sorted.
  TORCH_ARG(std::vector<std::string>, keys) = {};
  // "iteration", or "epoch": the "epoch" value on the key's lines.
  TORCH_ARG(std::string, x_axis) = "iteration";
  // A moving average over a trailing window of this many points (1: none).
  TORCH_ARG(int64_t, smooth) = 1;
  // A heading above the panels; none when empty.
  TORCH_ARG(std::string, title) = "";
};

// One key of one run: its points in iteration order. y may hold NaN and
// infinities (metrics.jsonl's "NaN", "Infinity", "-Infinity"); they are not drawn.
struct CurveSeries {
  std::string run;  // the legend's name: the work dir's last component, or the path given when two runs share it
  std::string key;
  std::vector<double> x, y;
};

// Keys that are not plotted unless named: "iteration", "epoch", "data_time", "time", "eta_seconds".
const std::vector<std::string>& curve_bookkeeping_keys();

// The metrics.jsonl of a work dir, or `work_dir_or_file` itself when it is a
// file. Throws naming the path when neither exists.
std::string metrics_file_of(const std::string& work_dir_or_file);

// Reads and validates every run's metrics.jsonl and returns its series, key
// by key (the panels' order), run by run within a key. Throws lockstep::Error
// naming file:line for a malformed line, the key for a --keys entry no run has
// (listing those that exist), or for --x epoch on a key no line with "epoch" holds.
std::vector<CurveSeries> read_metrics_curves(const std::vector<std::string>& work_dirs_or_files,
                                             const CurvePlotOptions& options);

// The SVG document: one panel per key (in the order the series name them),
// one <path class="curve"> per series, colours by run.
std::string render_curves_svg(const std::vector<CurveSeries>& series, const CurvePlotOptions& options);

// ---- the pieces, for tests and other plots ---------------------------------

// The points of `series` that are drawn: finite x and y only, y smoothed over `smooth` points.
CurveSeries drawable_curve(const CurveSeries& series, int64_t smooth);

// out[i] = the mean of values[i - window + 1 .. i] (fewer at the start); window >= 1.
std::vector<double> trailing_moving_average(const std::vector<double>& values, int64_t window);

// The tick spacing for about `target_count` ticks over `span`: 1, 2 or 5 x 10^k.
double nice_tick_step(double span, int target_count = 5);

// The multiples of nice_tick_step(hi - lo) within [lo, hi], ascending; {lo} when lo == hi.
std::vector<double> nice_ticks(double lo, double hi, int target_count = 5);

// A tick label with as many decimals as `step` needs: format_tick(0.30000000000000004, 0.1) == "0.3".
std::string format_tick(double value, double step);

// `text` with &, <, >, " and ' escaped, usable in XML text and attributes.
std::string xml_escape(const std::string& text);

}  // namespace lockstep
