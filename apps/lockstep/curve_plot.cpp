#include "apps/lockstep/curve_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lockstep/core/error.h"
#include "lockstep/core/read_file.h"
#include "lockstep/core/spelling.h"

namespace lockstep {
// A named namespace: unity builds put this file beside others whose anonymous
// namespaces would otherwise share names with these helpers.
namespace curve_plot_impl {
namespace {

namespace fs = std::filesystem;

// ---- reading ----------------------------------------------------------------

// A key's value on one line, and that line's "epoch" when it has one.
struct MetricPoint {
  double value = 0;
  std::optional<double> epoch;
};

// One run's metrics.jsonl: key -> iteration -> the point of the last line with that iteration.
struct RunMetrics {
  std::string source;  // as given
  std::string file;    // its metrics.jsonl
  std::string name;    // in the legend
  std::map<std::string, std::map<int64_t, MetricPoint>> keys;
};

void check_options(const CurvePlotOptions& options) {
  LOCKSTEP_CHECK(options.smooth() >= 1, "--smooth must be at least 1 (1: no smoothing), got ", options.smooth());
  LOCKSTEP_CHECK(options.x_axis() == "iteration" || options.x_axis() == "epoch", "--x must be iteration or epoch, got \"",
                 options.x_axis(), "\"");
}

// A JSON value as an error message shows it, cut short when long.
std::string shown(const nlohmann::json& value) {
  const std::string text = value.dump();
  return text.size() <= 60 ? text : text.substr(0, 57) + "...";
}

// A metric: a number, or the string JsonWriter writes for a non-finite one.
double metric_value(const nlohmann::json& value, const std::string& where, const std::string& key) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (text == "Infinity") return std::numeric_limits<double>::infinity();
    if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  LOCKSTEP_FAIL(where, ": \"", key, "\" is ", shown(value),
                "; a metric must be a number or one of the strings \"NaN\", \"Infinity\", \"-Infinity\"");
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string parse_error_text(const std::exception& error) {
  const std::string text = error.what();
  const auto end = text.find("] ");
  return end == std::string::npos ? text : text.substr(end + 2);
}

// One line as a JSON object with an integer "iteration"; `where` is "file:line".
nlohmann::json parse_line(const std::string& line, const std::string& where) {
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& error) {
    LOCKSTEP_FAIL(where, ": not JSON (", parse_error_text(error), ")");
  }
  LOCKSTEP_CHECK(object.is_object(), where, ": not a JSON object but ", shown(object));
  const auto iteration = object.find("iteration");
  LOCKSTEP_CHECK(iteration != object.end(), where, ": no \"iteration\"");
  LOCKSTEP_CHECK(iteration->is_number_integer(), where, ": \"iteration\" must be an integer, got ", shown(*iteration));
  return object;
}

// Records every key of a line; a later line with the same iteration replaces the earlier point.
void add_line(const nlohmann::json& object, const std::string& where, RunMetrics& run) {
  const int64_t iteration = object.at("iteration").get<int64_t>();
  std::optional<double> epoch;
  if (object.contains("epoch")) epoch = metric_value(object.at("epoch"), where, "epoch");
  for (const auto& item : object.items()) {
    run.keys[item.key()][iteration] = MetricPoint{metric_value(item.value(), where, item.key()), epoch};
  }
}

RunMetrics read_run(const std::string& source) {
  RunMetrics run;
  run.source = source;
  run.file = metrics_file_of(source);
  std::istringstream lines(read_file(run.file));
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = str_cat(run.file, ":", number);
    add_line(parse_line(line, where), where, run);
  }
  return run;
}

// The last component of the folder holding the run's metrics.jsonl; `source` when there is none.
std::string work_dir_name(const RunMetrics& run) {
  std::error_code error;
  const fs::path file = fs::absolute(run.file, error);
  const std::string name = file.lexically_normal().parent_path().filename().string();
  return error || name.empty() ? run.source : name;
}

// Legend names: the work dir's name, or the path as given where two runs share a name.
void name_runs(std::vector<RunMetrics>& runs) {
  std::map<std::string, int> uses;
  for (auto& run : runs) ++uses[run.name = work_dir_name(run)];
  for (auto& run : runs) {
    if (uses[run.name] > 1) run.name = run.source;
  }
}

// ---- choosing keys ----------------------------------------------------------

template <typename Container>
std::string joined(const Container& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

std::string files_of(const std::vector<RunMetrics>& runs) {
  std::vector<std::string> files;
  for (const auto& run : runs) files.push_back(run.file);
  return joined(files);
}

std::set<std::string> keys_of(const std::vector<RunMetrics>& runs) {
  std::set<std::string> keys;
  for (const auto& run : runs) {
    for (const auto& entry : run.keys) keys.insert(entry.first);
  }
  return keys;
}

bool is_bookkeeping(const std::string& key) {
  const auto& bookkeeping = curve_bookkeeping_keys();
  return std::find(bookkeeping.begin(), bookkeeping.end(), key) != bookkeeping.end();
}

// --keys as given (each checked, repeats dropped), or every key but the bookkeeping ones.
std::vector<std::string> chosen_keys(const std::vector<RunMetrics>& runs, const CurvePlotOptions& options) {
  const std::set<std::string> existing = keys_of(runs);
  LOCKSTEP_CHECK(!existing.empty(), "no metrics to plot: ", files_of(runs), " hold no lines");
  std::vector<std::string> keys;
  if (options.keys().empty()) {
    std::copy_if(existing.begin(), existing.end(), std::back_inserter(keys),
                 [](const std::string& key) { return !is_bookkeeping(key); });
    LOCKSTEP_CHECK(!keys.empty(), "no metrics to plot: ", files_of(runs), " hold only bookkeeping keys (",
                   joined(existing), "); name the ones to plot with --keys");
    return keys;
  }
  for (const auto& key : options.keys()) {
    LOCKSTEP_CHECK(existing.count(key) > 0, "--keys: no run has the key \"", key, "\"",
                   did_you_mean(key, std::vector<std::string>(existing.begin(), existing.end())), "; the keys in ",
                   files_of(runs), " are: ", joined(existing));
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  return keys;
}

bool any_line_has_epoch(const std::vector<RunMetrics>& runs, const std::string& key) {
  for (const auto& run : runs) {
    const auto found = run.keys.find(key);
    if (found == run.keys.end()) continue;
    for (const auto& entry : found->second) {
      if (entry.second.epoch) return true;
    }
  }
  return false;
}

// Against epochs: a key named with --keys must have lines with "epoch"; of
// the default keys, those without are left out (only evaluation lines carry
// "epoch"), and at least one must remain.
std::vector<std::string> keys_with_epochs(const std::vector<RunMetrics>& runs, const std::vector<std::string>& keys,
                                          bool named) {
  std::vector<std::string> kept;
  for (const auto& key : keys) {
    const bool has_epoch = any_line_has_epoch(runs, key);
    LOCKSTEP_CHECK(has_epoch || !named, "--x epoch: no line with the key \"", key, "\" in ", files_of(runs),
                   " carries an \"epoch\"; plot it against --x iteration");
    if (has_epoch) kept.push_back(key);
  }
  LOCKSTEP_CHECK(!kept.empty(), "--x epoch: no line with any of the keys ", joined(keys), " in ", files_of(runs),
                 " carries an \"epoch\"; plot them against --x iteration");
  return kept;
}

// A run's points of `key` in iteration order, against iterations or the lines' epochs.
CurveSeries series_of(const RunMetrics& run, const std::string& key, bool by_epoch) {
  CurveSeries series{run.name, key, {}, {}};
  for (const auto& [iteration, point] : run.keys.at(key)) {
    if (by_epoch && !point.epoch) continue;
    series.x.push_back(by_epoch ? *point.epoch : static_cast<double>(iteration));
    series.y.push_back(point.value);
  }
  return series;
}

// ---- drawing ----------------------------------------------------------------

constexpr double kWidth = 900;
constexpr double kHeaderHeight = 40;  // above the panels, when there is a title
constexpr double kPanelHeight = 280;
constexpr double kPlotLeft = 72;
constexpr double kPlotTop = 34;  // within a panel, below its title
constexpr double kPlotWidth = 560;
constexpr double kPlotHeight = 190;
constexpr double kLegendLeft = kPlotLeft + kPlotWidth + 20;
constexpr int kTickTarget = 5;

// matplotlib's tab10: distinct colours, one per run; runs past ten are dashed.
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

std::string stroke_of(size_t run_index) {
  std::string stroke = str_cat("stroke=\"", kPalette[run_index % kPaletteSize], "\"");
  if (run_index >= kPaletteSize) stroke += " stroke-dasharray=\"6 3\"";
  return stroke;
}

// A coordinate with two decimals.
std::string coordinate(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", value);
  return text;
}

struct AxisRange {
  double lo = 0, hi = 1;
};

// min..max of `values` widened by `margin` of the span on each side; never empty.
AxisRange range_of(const std::vector<double>& values, double margin) {
  if (values.empty()) return {};
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  if (*lo == *hi) {
    const double pad = *lo == 0 ? 1 : std::abs(*lo) * 0.05;
    return {*lo - pad, *hi + pad};
  }
  const double pad = (*hi - *lo) * margin;
  return {*lo - pad, *hi + pad};
}

// The data ranges of a panel and where they land in the SVG.
struct PanelFrame {
  AxisRange x, y;
  double top = 0;  // of the plot area
  double px(double value) const { return kPlotLeft + (value - x.lo) / (x.hi - x.lo) * kPlotWidth; }
  double py(double value) const { return top + kPlotHeight - (value - y.lo) / (y.hi - y.lo) * kPlotHeight; }
};

PanelFrame frame_of(const std::vector<CurveSeries>& curves, double top) {
  std::vector<double> xs, ys;
  for (const auto& curve : curves) {
    xs.insert(xs.end(), curve.x.begin(), curve.x.end());
    ys.insert(ys.end(), curve.y.begin(), curve.y.end());
  }
  return PanelFrame{range_of(xs, 0.0), range_of(ys, 0.05), top};
}

void draw_text(std::ostream& svg, double x, double y, const std::string& text, const std::string& attributes = "") {
  svg << "<text x=\"" << coordinate(x) << "\" y=\"" << coordinate(y) << "\"" << (attributes.empty() ? "" : " ")
      << attributes << ">" << xml_escape(text) << "</text>\n";
}

void draw_line(std::ostream& svg, double x1, double y1, double x2, double y2, const std::string& attributes) {
  svg << "<line x1=\"" << coordinate(x1) << "\" y1=\"" << coordinate(y1) << "\" x2=\"" << coordinate(x2)
      << "\" y2=\"" << coordinate(y2) << "\" " << attributes << "/>\n";
}

const char* const kGridLine = "stroke=\"#e0e0e0\" stroke-width=\"1\"";

void draw_x_ticks(std::ostream& svg, const PanelFrame& frame) {
  const double step = nice_tick_step(frame.x.hi - frame.x.lo, kTickTarget);
  const double bottom = frame.top + kPlotHeight;
  for (double tick : nice_ticks(frame.x.lo, frame.x.hi, kTickTarget)) {
    draw_line(svg, frame.px(tick), frame.top, frame.px(tick), bottom, kGridLine);
    draw_line(svg, frame.px(tick), bottom, frame.px(tick), bottom + 4, "stroke=\"#555\"");
    draw_text(svg, frame.px(tick), bottom + 17, format_tick(tick, step), "text-anchor=\"middle\"");
  }
}

void draw_y_ticks(std::ostream& svg, const PanelFrame& frame) {
  const double step = nice_tick_step(frame.y.hi - frame.y.lo, kTickTarget);
  for (double tick : nice_ticks(frame.y.lo, frame.y.hi, kTickTarget)) {
    draw_line(svg, kPlotLeft, frame.py(tick), kPlotLeft + kPlotWidth, frame.py(tick), kGridLine);
    draw_line(svg, kPlotLeft - 4, frame.py(tick), kPlotLeft, frame.py(tick), "stroke=\"#555\"");
    draw_text(svg, kPlotLeft - 7, frame.py(tick) + 4, format_tick(tick, step), "text-anchor=\"end\"");
  }
}

void draw_curve(std::ostream& svg, const CurveSeries& curve, const PanelFrame& frame, size_t run_index) {
  std::string path;
  for (size_t i = 0; i < curve.x.size(); ++i) {
    path += str_cat(i == 0 ? "M" : " L", coordinate(frame.px(curve.x[i])), ",", coordinate(frame.py(curve.y[i])));
  }
  svg << "<path class=\"curve\" data-key=\"" << xml_escape(curve.key) << "\" data-run=\"" << xml_escape(curve.run)
      << "\" data-points=\"" << curve.x.size() << "\" d=\"" << path << "\" fill=\"none\" " << stroke_of(run_index)
      << " stroke-width=\"1.5\" stroke-linejoin=\"round\"/>\n";
  if (curve.x.size() == 1) {  // a path of one point draws nothing: mark it
    svg << "<circle cx=\"" << coordinate(frame.px(curve.x[0])) << "\" cy=\"" << coordinate(frame.py(curve.y[0]))
        << "\" r=\"3\" fill=\"" << kPalette[run_index % kPaletteSize] << "\"/>\n";
  }
}

void draw_legend(std::ostream& svg, const std::vector<CurveSeries>& curves, const std::vector<size_t>& run_indices,
                 const PanelFrame& frame, int64_t smooth) {
  double y = frame.top + 10;
  for (size_t i = 0; i < curves.size(); ++i, y += 18) {
    draw_line(svg, kLegendLeft, y, kLegendLeft + 22, y, stroke_of(run_indices[i]) + " stroke-width=\"2\"");
    draw_text(svg, kLegendLeft + 28, y + 4, curves[i].run);
  }
  if (smooth > 1) {
    draw_text(svg, kLegendLeft, y + 4, str_cat("moving average of ", smooth, " points"),
              "font-style=\"italic\" fill=\"#555\"");
  }
}

// One key's panel, `top` pixels down: title, axes, ticks, a curve per run, legend.
void draw_panel(std::ostream& svg, const std::string& key, const std::vector<CurveSeries>& curves,
                const std::vector<size_t>& run_indices, const CurvePlotOptions& options, double top) {
  const PanelFrame frame = frame_of(curves, top + kPlotTop);
  svg << "<g class=\"panel\">\n";
  draw_text(svg, kPlotLeft, top + 22, key, "font-size=\"14\" font-weight=\"bold\"");
  svg << "<rect x=\"" << coordinate(kPlotLeft) << "\" y=\"" << coordinate(frame.top) << "\" width=\""
      << coordinate(kPlotWidth) << "\" height=\"" << coordinate(kPlotHeight) << "\" fill=\"none\" stroke=\"#999\"/>\n";
  draw_x_ticks(svg, frame);
  draw_y_ticks(svg, frame);
  draw_text(svg, kPlotLeft + kPlotWidth / 2, frame.top + kPlotHeight + 36, options.x_axis(),
            "text-anchor=\"middle\"");
  for (size_t i = 0; i < curves.size(); ++i) draw_curve(svg, curves[i], frame, run_indices[i]);
  draw_legend(svg, curves, run_indices, frame, options.smooth());
  svg << "</g>\n";
}

// Distinct values of `field` over `series`, in the order they first appear.
std::vector<std::string> in_order_of_appearance(const std::vector<CurveSeries>& series,
                                                std::string CurveSeries::*field) {
  std::vector<std::string> values;
  for (const auto& one : series) {
    if (std::find(values.begin(), values.end(), one.*field) == values.end()) values.push_back(one.*field);
  }
  return values;
}

size_t index_in(const std::vector<std::string>& values, const std::string& value) {
  return static_cast<size_t>(std::find(values.begin(), values.end(), value) - values.begin());
}

std::vector<CurveSeries> read_curves(const std::vector<std::string>& work_dirs_or_files,
                                     const CurvePlotOptions& options) {
  check_options(options);
  LOCKSTEP_CHECK(!work_dirs_or_files.empty(), "no work dir or metrics.jsonl given");
  std::vector<RunMetrics> runs;
  for (const auto& source : work_dirs_or_files) runs.push_back(read_run(source));
  name_runs(runs);
  const bool by_epoch = options.x_axis() == "epoch";
  std::vector<std::string> keys = chosen_keys(runs, options);
  if (by_epoch) keys = keys_with_epochs(runs, keys, !options.keys().empty());
  std::vector<CurveSeries> series;
  for (const auto& key : keys) {
    for (const auto& run : runs) {
      if (run.keys.count(key) == 0) continue;
      CurveSeries one = series_of(run, key, by_epoch);
      if (!one.x.empty()) series.push_back(std::move(one));
    }
  }
  return series;
}

std::string render_svg(const std::vector<CurveSeries>& series, const CurvePlotOptions& options) {
  check_options(options);
  LOCKSTEP_CHECK(!series.empty(), "no curves to draw");
  const std::vector<std::string> keys = in_order_of_appearance(series, &CurveSeries::key);
  const std::vector<std::string> runs = in_order_of_appearance(series, &CurveSeries::run);
  const double header = options.title().empty() ? 0 : kHeaderHeight;
  const double height = header + kPanelHeight * static_cast<double>(keys.size());
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << kWidth << " " << height
      << "\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"12\">\n"
      << "<rect x=\"0\" y=\"0\" width=\"" << kWidth << "\" height=\"" << height << "\" fill=\"white\"/>\n";
  if (!options.title().empty()) {
    draw_text(svg, kWidth / 2, 27, options.title(), "text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\"");
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    std::vector<CurveSeries> curves;
    std::vector<size_t> run_indices;
    for (const auto& one : series) {
      if (one.key != keys[k]) continue;
      curves.push_back(drawable_curve(one, options.smooth()));
      run_indices.push_back(index_in(runs, one.run));
    }
    draw_panel(svg, keys[k], curves, run_indices, options, header + kPanelHeight * static_cast<double>(k));
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace
}  // namespace curve_plot_impl

const std::vector<std::string>& curve_bookkeeping_keys() {
  static const std::vector<std::string> keys{"iteration", "epoch", "data_time", "time", "eta_seconds"};
  return keys;
}

std::string metrics_file_of(const std::string& work_dir_or_file) {
  std::error_code error;
  if (std::filesystem::is_directory(work_dir_or_file, error)) {
    const std::string file = (std::filesystem::path(work_dir_or_file) / "metrics.jsonl").string();
    LOCKSTEP_CHECK(std::filesystem::exists(file, error), file, ": no such file; is ", work_dir_or_file,
                   " a lockstep work dir (its JsonWriter writes metrics.jsonl)?");
    return file;
  }
  LOCKSTEP_CHECK(std::filesystem::exists(work_dir_or_file, error), work_dir_or_file,
                 ": no such work dir or metrics.jsonl file");
  return work_dir_or_file;
}

std::vector<CurveSeries> read_metrics_curves(const std::vector<std::string>& work_dirs_or_files,
                                             const CurvePlotOptions& options) {
  return curve_plot_impl::read_curves(work_dirs_or_files, options);
}

std::string render_curves_svg(const std::vector<CurveSeries>& series, const CurvePlotOptions& options) {
  return curve_plot_impl::render_svg(series, options);
}

CurveSeries drawable_curve(const CurveSeries& series, int64_t smooth) {
  LOCKSTEP_CHECK(series.x.size() == series.y.size(), "the curve of ", series.key, " in ", series.run, " has ",
                 series.x.size(), " x values but ", series.y.size(), " y values");
  CurveSeries drawn{series.run, series.key, {}, {}};
  for (size_t i = 0; i < series.x.size(); ++i) {
    if (!std::isfinite(series.x[i]) || !std::isfinite(series.y[i])) continue;
    drawn.x.push_back(series.x[i]);
    drawn.y.push_back(series.y[i]);
  }
  drawn.y = trailing_moving_average(drawn.y, smooth);
  return drawn;
}

std::vector<double> trailing_moving_average(const std::vector<double>& values, int64_t window) {
  LOCKSTEP_CHECK(window >= 1, "--smooth must be at least 1 (1: no smoothing), got ", window);
  const size_t size = static_cast<size_t>(window);
  std::vector<double> averages;
  averages.reserve(values.size());
  double sum = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    sum += values[i];
    if (i >= size) sum -= values[i - size];
    averages.push_back(sum / static_cast<double>(std::min(i + 1, size)));
  }
  return averages;
}

double nice_tick_step(double span, int target_count) {
  const double raw = span / std::max(1, target_count);
  if (!(raw > 0) || !std::isfinite(raw)) return 1;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;  // in [1, 10)
  constexpr double kSlack = 1e-9;           // 0.1 / 0.1 may come out a hair above 1
  const double nice = fraction <= 1 + kSlack ? 1 : fraction <= 2 + kSlack ? 2 : fraction <= 5 + kSlack ? 5 : 10;
  return nice * magnitude;
}

std::vector<double> nice_ticks(double lo, double hi, int target_count) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  if (lo > hi) std::swap(lo, hi);
  if (lo == hi) return {lo};
  const double step = nice_tick_step(hi - lo, target_count);
  // k * mantissa * 10^exponent, divided rather than multiplied by a power of
  // ten below 1, so that 3 x 0.1 is 0.3 and not 0.30000000000000004.
  const int exponent = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  const double mantissa = std::round(step / std::pow(10.0, exponent));
  const double scale = std::pow(10.0, std::abs(exponent));
  const double first = std::ceil(lo / step - 1e-9);
  const double last = std::floor(hi / step + 1e-9);
  std::vector<double> ticks;
  for (int i = 0; first + i <= last && i <= 4 * target_count + 4; ++i) {
    const double multiple = (first + i) * mantissa;
    ticks.push_back(exponent >= 0 ? multiple * scale : multiple / scale);
  }
  return ticks;
}

std::string format_tick(double value, double step) {
  if (!(step > 0) || !std::isfinite(step)) step = value != 0 ? std::abs(value) : 1;
  if (std::abs(value) < step * 1e-6) value = 0;  // no "-0" or 1e-17 for zero
  const int step_exponent = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  char text[64];
  if (step_exponent < -5 || std::abs(value) >= 1e6) {
    const int value_exponent = value == 0 ? step_exponent : static_cast<int>(std::floor(std::log10(std::abs(value))));
    const int digits = std::clamp(value_exponent - step_exponent + 1, 1, 15);
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
  } else {
    std::snprintf(text, sizeof(text), "%.*f", std::max(0, -step_exponent), value);
  }
  return text;
}

std::string xml_escape(const std::string& text) {
  std::string escaped;
  escaped.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&apos;"; break;
      default:
        // XML 1.0 has no control characters but tab, newline and carriage return.
        const bool control = static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r';
        escaped += control ? '?' : c;
    }
  }
  return escaped;
}

}  // namespace lockstep
