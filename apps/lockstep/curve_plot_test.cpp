#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <utility>

#include "apps/lockstep/curve_plot.h"
#include "tests/support/test_support.h"

namespace lockstep {
// Named: the unity build puts this file beside the folder's other tests.
namespace curve_plot_test {
namespace {

// Writes `lines` as <dir>/<name>/metrics.jsonl and returns the run's folder.
std::string write_run(const testing::TempDir& dir, const std::string& name, const std::string& lines) {
  std::filesystem::create_directories(dir.file(name));
  testing::write_file(dir.file(name + "/metrics.jsonl"), lines);
  return dir.file(name);
}

// (key, run) -> data-points of every <path class="curve"> in `svg`.
std::map<std::pair<std::string, std::string>, int> curves_in(const std::string& svg) {
  std::map<std::pair<std::string, std::string>, int> curves;
  const std::regex path("<path class=\"curve\" data-key=\"([^\"]*)\" data-run=\"([^\"]*)\" data-points=\"([0-9]+)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), path); it != std::sregex_iterator(); ++it) {
    const auto inserted = curves.emplace(std::make_pair((*it)[1].str(), (*it)[2].str()), std::stoi((*it)[3].str()));
    EXPECT_TRUE(inserted.second) << "two curves for " << (*it)[1] << " of " << (*it)[2];
  }
  return curves;
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++count;
  return count;
}

const CurveSeries* find_series(const std::vector<CurveSeries>& series, const std::string& key, const std::string& run) {
  for (const auto& one : series) {
    if (one.key == key && one.run == run) return &one;
  }
  return nullptr;
}

// ---- ticks and smoothing ----------------------------------------------------

TEST(CurvePlotTicks, StepsAreOneTwoOrFiveTimesAPowerOfTen) {
  EXPECT_DOUBLE_EQ(nice_tick_step(10, 5), 2);
  EXPECT_DOUBLE_EQ(nice_tick_step(1, 5), 0.2);
  EXPECT_DOUBLE_EQ(nice_tick_step(0.5, 5), 0.1);
  EXPECT_DOUBLE_EQ(nice_tick_step(20, 5), 5);
  EXPECT_DOUBLE_EQ(nice_tick_step(3000, 5), 1000);
  EXPECT_DOUBLE_EQ(nice_tick_step(4e-5, 5), 1e-5);
  for (double span : {0.0037, 0.9, 1.0, 7.3, 42.0, 999.0, 123456.0}) {
    const double step = nice_tick_step(span, 5);
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 || std::abs(mantissa - 5) < 1e-9)
        << span << " -> " << step;
    EXPECT_LE(span / step, 5 + 1e-9) << span;  // at most target + 1 ticks
    EXPECT_GT(span / step, 1) << span;         // and at least 2
  }
}

TEST(CurvePlotTicks, TicksAreExactMultiplesWithinTheRange) {
  EXPECT_EQ(nice_ticks(0, 1), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_EQ(nice_ticks(0.03, 0.97), (std::vector<double>{0.2, 0.4, 0.6, 0.8}));
  EXPECT_EQ(nice_ticks(-3, 17), (std::vector<double>{0, 5, 10, 15}));
  EXPECT_EQ(nice_ticks(17, -3), (std::vector<double>{0, 5, 10, 15}));
  EXPECT_EQ(nice_ticks(199, 10199), (std::vector<double>{2000, 4000, 6000, 8000, 10000}));
  EXPECT_EQ(nice_ticks(0.1, 0.4), (std::vector<double>{0.1, 0.2, 0.3, 0.4}));
  EXPECT_EQ(nice_ticks(0.1, 0.3), (std::vector<double>{0.1, 0.15, 0.2, 0.25, 0.3}));
  EXPECT_EQ(nice_ticks(2.5, 2.5), (std::vector<double>{2.5}));
  EXPECT_TRUE(nice_ticks(0, std::nan("")).empty());
}

TEST(CurvePlotTicks, LabelsShowTheDigitsTheStepNeeds) {
  EXPECT_EQ(format_tick(0.30000000000000004, 0.1), "0.3");
  EXPECT_EQ(format_tick(0.25, 0.05), "0.25");
  EXPECT_EQ(format_tick(-1e-17, 0.2), "0.0");
  EXPECT_EQ(format_tick(4000, 2000), "4000");
  EXPECT_EQ(format_tick(15, 5), "15");
  EXPECT_EQ(format_tick(2e-6, 1e-6), "2e-06");
  EXPECT_EQ(format_tick(1.5e6, 5e5), "1.5e+06");
}

TEST(CurvePlotSmoothing, TrailingMovingAverage) {
  const std::vector<double> values{1, 2, 3, 4, 5};
  EXPECT_EQ(trailing_moving_average(values, 1), values);
  const auto two = trailing_moving_average(values, 2);
  const std::vector<double> expected_two{1, 1.5, 2.5, 3.5, 4.5};
  ASSERT_EQ(two.size(), expected_two.size());
  for (size_t i = 0; i < two.size(); ++i) EXPECT_NEAR(two[i], expected_two[i], 1e-12) << i;
  const auto three = trailing_moving_average(values, 3);
  const std::vector<double> expected_three{1, 1.5, 2, 3, 4};
  for (size_t i = 0; i < three.size(); ++i) EXPECT_NEAR(three[i], expected_three[i], 1e-12) << i;
  const auto wide = trailing_moving_average(values, 10);  // wider than the data: running mean
  EXPECT_NEAR(wide.back(), 3, 1e-12);
  EXPECT_TRUE(trailing_moving_average({}, 3).empty());
  EXPECT_NE(testing::error_of([&] { trailing_moving_average(values, 0); }).find("--smooth must be at least 1"),
            std::string::npos);
}

TEST(CurvePlotSmoothing, SmoothingKeepsThePointCountAndShowsInTheLegend) {
  const CurveSeries series{"run", "loss", {0, 1, 2, 3}, {4, 2, 0, 2}};
  const CurveSeries smoothed = drawable_curve(series, 2);
  EXPECT_EQ(smoothed.x, series.x);
  EXPECT_EQ(smoothed.y, (std::vector<double>{4, 3, 1, 1}));
  const std::string plain = render_curves_svg({series}, CurvePlotOptions());
  const std::string svg = render_curves_svg({series}, CurvePlotOptions().smooth(3));
  EXPECT_EQ(plain.find("moving average"), std::string::npos);
  EXPECT_NE(svg.find("moving average of 3 points"), std::string::npos) << svg;
  EXPECT_EQ(curves_in(svg).at({"loss", "run"}), 4);
}

// ---- reading metrics.jsonl --------------------------------------------------

TEST(CurvePlotRead, AResumedRunKeepsTheLastLineOfAnIteration) {
  testing::TempDir dir;
  // Trained to iteration 3, then resumed from iteration 1's checkpoint and appended.
  const std::string run = write_run(dir, "resumed",
                                    "{\"iteration\": 0, \"loss\": 1.0, \"lr\": 0.1}\n"
                                    "{\"iteration\": 1, \"loss\": 0.9, \"lr\": 0.1}\n"
                                    "{\"iteration\": 2, \"loss\": 0.8, \"lr\": 0.1}\n"
                                    "{\"iteration\": 3, \"loss\": 0.7, \"lr\": 0.1}\n"
                                    "\n"
                                    "{\"iteration\": 2, \"loss\": 0.75}\n"
                                    "{\"iteration\": 3, \"loss\": 0.65}\n"
                                    "{\"iteration\": 4, \"loss\": 0.55}\n");
  const auto series = read_metrics_curves({run}, CurvePlotOptions().keys({"loss", "lr"}));
  ASSERT_EQ(series.size(), 2u);
  const CurveSeries* loss = find_series(series, "loss", "resumed");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->x, (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(loss->y, (std::vector<double>{1.0, 0.9, 0.75, 0.65, 0.55}));
  const CurveSeries* lr = find_series(series, "lr", "resumed");
  ASSERT_NE(lr, nullptr);
  EXPECT_EQ(lr->x, (std::vector<double>{0, 1, 2, 3}));  // the resumed lines had none: the old points stay
}

TEST(CurvePlotRead, NonFiniteValuesAreReadAndNotDrawn) {
  testing::TempDir dir;
  const std::string run = write_run(dir, "diverged",
                                    "{\"iteration\": 0, \"loss\": 1.0}\n"
                                    "{\"iteration\": 1, \"loss\": \"NaN\"}\n"
                                    "{\"iteration\": 2, \"loss\": 0.5}\n"
                                    "{\"iteration\": 3, \"loss\": \"Infinity\"}\n"
                                    "{\"iteration\": 4, \"loss\": \"-Infinity\"}\n");
  const auto series = read_metrics_curves({run}, CurvePlotOptions());
  ASSERT_EQ(series.size(), 1u);
  ASSERT_EQ(series[0].y.size(), 5u);
  EXPECT_TRUE(std::isnan(series[0].y[1]));
  EXPECT_EQ(series[0].y[3], std::numeric_limits<double>::infinity());
  EXPECT_EQ(series[0].y[4], -std::numeric_limits<double>::infinity());
  const CurveSeries drawn = drawable_curve(series[0], 1);
  EXPECT_EQ(drawn.x, (std::vector<double>{0, 2}));
  EXPECT_EQ(drawn.y, (std::vector<double>{1.0, 0.5}));
  const std::string svg = render_curves_svg(series, CurvePlotOptions());
  EXPECT_EQ(curves_in(svg).at({"loss", "diverged"}), 2);
  EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("inf"), std::string::npos) << svg;
}

TEST(CurvePlotRead, DefaultKeysLeaveOutBookkeepingAndNamedOnesAreDrawn) {
  testing::TempDir dir;
  const std::string run = write_run(dir, "run",
                                    "{\"data_time\": 0.001, \"eta_seconds\": 9, \"iteration\": 9, \"loss\": 0.4, "
                                    "\"lr\": 0.1, \"time\": 0.03}\n"
                                    "{\"accuracy/top1\": 0.8, \"epoch\": 1, \"iteration\": 10}\n");
  std::vector<std::string> keys;
  for (const auto& one : read_metrics_curves({run}, CurvePlotOptions())) keys.push_back(one.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"accuracy/top1", "loss", "lr"}));
  const auto named = read_metrics_curves({run}, CurvePlotOptions().keys({"time", "loss", "time"}));
  ASSERT_EQ(named.size(), 2u);  // in the order named, once each
  EXPECT_EQ(named[0].key, "time");
  EXPECT_EQ(named[1].key, "loss");
}

TEST(CurvePlotRead, EpochAxisUsesTheLinesEpochs) {
  testing::TempDir dir;
  const std::string run = write_run(dir, "by_epoch",
                                    "{\"iteration\": 49, \"loss\": 0.9}\n"
                                    "{\"accuracy/top1\": 0.5, \"epoch\": 1, \"iteration\": 50}\n"
                                    "{\"iteration\": 99, \"loss\": 0.7}\n"
                                    "{\"accuracy/top1\": 0.7, \"epoch\": 2, \"iteration\": 100}\n");
  // Default keys: only those on lines with an epoch.
  const auto series = read_metrics_curves({run}, CurvePlotOptions().x_axis("epoch"));
  ASSERT_EQ(series.size(), 1u);
  EXPECT_EQ(series[0].key, "accuracy/top1");
  EXPECT_EQ(series[0].x, (std::vector<double>{1, 2}));
  EXPECT_EQ(series[0].y, (std::vector<double>{0.5, 0.7}));
  const std::string svg = render_curves_svg(series, CurvePlotOptions().x_axis("epoch"));
  EXPECT_NE(svg.find(">epoch</text>"), std::string::npos);
  // Named: a key whose lines carry no epoch is an error naming it.
  const std::string message =
      testing::error_of([&] { read_metrics_curves({run}, CurvePlotOptions().keys({"loss"}).x_axis("epoch")); });
  EXPECT_NE(message.find("--x epoch: no line with the key \"loss\""), std::string::npos) << message;
}

TEST(CurvePlotRead, RunsAreNamedByTheirWorkDirOrTheirPathWhenNamesCollide) {
  testing::TempDir dir;
  const std::string line = "{\"iteration\": 1, \"loss\": 0.5}\n";
  const std::string a = write_run(dir, "a/run", line);
  const std::string b = write_run(dir, "b/run", line);
  const std::string c = write_run(dir, "c", line);
  const auto series = read_metrics_curves({a, b, c + "/metrics.jsonl"}, CurvePlotOptions());
  ASSERT_EQ(series.size(), 3u);
  EXPECT_EQ(series[0].run, a);
  EXPECT_EQ(series[1].run, b);
  EXPECT_EQ(series[2].run, "c");
  EXPECT_EQ(read_metrics_curves({c + "/"}, CurvePlotOptions())[0].run, "c");
}

// ---- errors -----------------------------------------------------------------

TEST(CurvePlotErrors, MissingWorkDirOrFileIsNamed) {
  testing::TempDir dir;
  const std::string missing = dir.file("no_such_run");
  std::string message = testing::error_of([&] { read_metrics_curves({missing}, CurvePlotOptions()); });
  EXPECT_NE(message.find(missing + ": no such work dir or metrics.jsonl file"), std::string::npos) << message;
  std::filesystem::create_directories(dir.file("empty_dir"));
  message = testing::error_of([&] { read_metrics_curves({dir.file("empty_dir")}, CurvePlotOptions()); });
  EXPECT_NE(message.find(dir.file("empty_dir/metrics.jsonl") + ": no such file"), std::string::npos) << message;
}

TEST(CurvePlotErrors, MalformedLinesNameFileAndLine) {
  testing::TempDir dir;
  const std::string good = "{\"iteration\": 1, \"loss\": 0.5}\n";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"{\"iteration\": 2, \"loss\": 0.4", ":3: not JSON ("},
      {"[1, 2]", ":3: not a JSON object but [1,2]"},
      {"{\"loss\": 0.4}", ":3: no \"iteration\""},
      {"{\"iteration\": 2.5, \"loss\": 0.4}", ":3: \"iteration\" must be an integer, got 2.5"},
      {"{\"iteration\": \"2\", \"loss\": 0.4}", ":3: \"iteration\" must be an integer, got \"2\""},
      {"{\"iteration\": 2, \"loss\": \"nan\"}", ":3: \"loss\" is \"nan\"; a metric must be a number or one of"},
      {"{\"iteration\": 2, \"loss\": true}", ":3: \"loss\" is true"},
      {"{\"iteration\": 2, \"loss\": [0.4]}", ":3: \"loss\" is [0.4]"},
      {"{\"iteration\": 2, \"epoch\": null, \"loss\": 0.4}", ":3: \"epoch\" is null"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    // Line 2 is empty: skipped, but counted.
    const std::string run = write_run(dir, "bad" + std::to_string(i), good + "\n" + cases[i].first + "\n" + good);
    const std::string message = testing::error_of([&] { read_metrics_curves({run}, CurvePlotOptions()); });
    EXPECT_NE(message.find(run + "/metrics.jsonl" + cases[i].second), std::string::npos)
        << cases[i].first << "\n" << message;
  }
}

TEST(CurvePlotErrors, UnknownKeyIsNamedWithTheKeysThatExist) {
  testing::TempDir dir;
  const std::string a = write_run(dir, "a", "{\"iteration\": 1, \"loss\": 0.5, \"lr\": 0.1}\n");
  const std::string b = write_run(dir, "b", "{\"iteration\": 1, \"accuracy/top1\": 0.5}\n");
  const std::string message =
      testing::error_of([&] { read_metrics_curves({a, b}, CurvePlotOptions().keys({"loss", "los"})); });
  EXPECT_NE(message.find("--keys: no run has the key \"los\" (did you mean 'loss'?)"), std::string::npos) << message;
  EXPECT_NE(message.find("are: accuracy/top1, iteration, loss, lr"), std::string::npos) << message;
}

TEST(CurvePlotErrors, BadOptionsAndEmptyRunsAreRefused) {
  testing::TempDir dir;
  const std::string run = write_run(dir, "run", "{\"iteration\": 1, \"loss\": 0.5}\n");
  EXPECT_NE(testing::error_of([&] { read_metrics_curves({run}, CurvePlotOptions().smooth(0)); })
                .find("--smooth must be at least 1 (1: no smoothing), got 0"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { read_metrics_curves({run}, CurvePlotOptions().x_axis("time")); })
                .find("--x must be iteration or epoch"),
            std::string::npos);
  const std::string empty = write_run(dir, "empty", "\n");
  EXPECT_NE(testing::error_of([&] { read_metrics_curves({empty}, CurvePlotOptions()); }).find("hold no lines"),
            std::string::npos);
  const std::string bookkeeping = write_run(dir, "bookkeeping", "{\"iteration\": 1, \"time\": 0.5}\n");
  EXPECT_NE(testing::error_of([&] { read_metrics_curves({bookkeeping}, CurvePlotOptions()); })
                .find("hold only bookkeeping keys (iteration, time); name the ones to plot with --keys"),
            std::string::npos);
}

// ---- rendering --------------------------------------------------------------

TEST(CurvePlotRender, OneCurvePerKeyAndRunWithItsPointCount) {
  testing::TempDir dir;
  const std::string a = write_run(dir, "a",
                                  "{\"iteration\": 0, \"loss\": 1.0}\n"
                                  "{\"iteration\": 1, \"loss\": 0.8}\n"
                                  "{\"iteration\": 2, \"loss\": 0.6}\n");
  const std::string b = write_run(dir, "b",
                                  "{\"iteration\": 0, \"loss\": 1.1}\n"
                                  "{\"iteration\": 1, \"loss\": \"NaN\"}\n"
                                  "{\"accuracy/top1\": 0.5, \"iteration\": 2}\n");
  const CurvePlotOptions options = CurvePlotOptions().keys({"loss", "accuracy/top1"}).title("two runs");
  const std::string svg = render_curves_svg(read_metrics_curves({a, b}, options), options);
  const std::map<std::pair<std::string, std::string>, int> expected{
      {{"loss", "a"}, 3}, {{"loss", "b"}, 1}, {{"accuracy/top1", "b"}, 1}};
  EXPECT_EQ(curves_in(svg), expected) << svg;
  EXPECT_EQ(count_of(svg, "class=\"curve\""), 3u);
  EXPECT_EQ(count_of(svg, "<g class=\"panel\">"), 2u);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find(">two runs</text>"), std::string::npos);
  EXPECT_NE(svg.find(">iteration</text>"), std::string::npos);
  EXPECT_LT(svg.find(">loss</text>"), svg.find(">accuracy/top1</text>"));  // panels in --keys order
  EXPECT_EQ(count_of(svg, "<svg"), 1u);
  EXPECT_EQ(count_of(svg, "</svg>"), 1u);
}

TEST(CurvePlotRender, EscapesXmlInKeysRunsAndTitle) {
  EXPECT_EQ(xml_escape("a<b&c>\"d'"), "a&lt;b&amp;c&gt;&quot;d&apos;");
  EXPECT_EQ(xml_escape(std::string("bell\x07")), "bell?");
  testing::TempDir dir;
  const std::string run = write_run(dir, "r&'d\"", "{\"iteration\": 1, \"a<b&c\": 0.5}\n");
  const CurvePlotOptions options = CurvePlotOptions().title("<x> & 'y'");
  const std::string svg = render_curves_svg(read_metrics_curves({run}, options), options);
  EXPECT_EQ(curves_in(svg).at({"a&lt;b&amp;c", "r&amp;&apos;d&quot;"}), 1) << svg;
  EXPECT_NE(svg.find(">a&lt;b&amp;c</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">&lt;x&gt; &amp; &apos;y&apos;</text>"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(svg.find("<x>"), std::string::npos);
}

}  // namespace
}  // namespace curve_plot_test
}  // namespace lockstep
