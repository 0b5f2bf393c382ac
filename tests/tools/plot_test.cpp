// `lockstep plot` on the work dirs of real runs: a 2-rank DDP run and a 2-rank
// run with evaluation, plotted into one SVG that Python's xml.etree parses,
// with one curve per key and run holding exactly the finite values of that
// key in that run's metrics.jsonl (counted here, from the file); and the
// command's errors, each naming what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "tests/support/small_job.h"
#include "tests/support/test_support.h"

namespace lockstep {
// Named: the unity build puts this file beside the area's other tests.
namespace plot_test {
namespace {

using CurveId = std::pair<std::string, std::string>;  // (key, run)

testing::CommandResult lockstep_plot(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv{testing::lockstep_binary(), "plot"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_command(argv, env, 120);
}

// `lockstep train CONFIG --nproc 2 --work-dir DIR --set ...`.
testing::CommandResult train_on_two_ranks(const std::string& config, const std::string& work_dir,
                                          const std::vector<std::string>& sets) {
  std::vector<std::string> argv{testing::lockstep_binary(), "train", config, "--nproc", "2", "--work-dir", work_dir};
  for (const auto& assignment : sets) argv.insert(argv.end(), {"--set", assignment});
  return testing::run_command(argv, {}, 300);
}

// key -> how many finite values a metrics.jsonl holds for it, where a later
// line of the same iteration (a resumed run) replaces an earlier one.
std::map<std::string, int> finite_values_per_key(const std::string& metrics_file) {
  std::map<std::string, std::map<int64_t, bool>> finite;  // key -> iteration -> finite
  std::istringstream lines(testing::read_file(metrics_file));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const auto object = nlohmann::json::parse(line);
    const int64_t iteration = object.at("iteration").get<int64_t>();
    for (const auto& item : object.items()) {
      finite[item.key()][iteration] = item.value().is_number() && std::isfinite(item.value().get<double>());
    }
  }
  std::map<std::string, int> counts;
  for (const auto& [key, by_iteration] : finite) {
    for (const auto& entry : by_iteration) counts[key] += entry.second ? 1 : 0;
  }
  return counts;
}

// Parses the SVG with xml.etree and returns, per curve path, its data-points;
// a path whose `d` holds a different number of points fails the test.
std::map<CurveId, int> curves_in_svg(const std::string& svg_file) {
  const char* script = R"(
import json, re, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == '{http://www.w3.org/2000/svg}svg', root.tag
curves = []
for path in root.iter('{http://www.w3.org/2000/svg}path'):
    if path.get('class') != 'curve':
        continue
    drawn = len(re.findall(r'[ML]', path.get('d', '')))
    curves.append([path.get('data-key'), path.get('data-run'), int(path.get('data-points')), drawn])
print(json.dumps(curves))
)";
  auto result = testing::run_command({testing::python(), "-c", script, svg_file}, {}, 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  std::map<CurveId, int> curves;
  if (result.exit_code != 0) return curves;
  for (const auto& curve : nlohmann::json::parse(result.output)) {
    const CurveId id{curve.at(0).get<std::string>(), curve.at(1).get<std::string>()};
    const int points = curve.at(2).get<int>();
    EXPECT_EQ(curve.at(3).get<int>(), points) << id.first << " of " << id.second << ": d holds another number of points";
    EXPECT_TRUE(curves.emplace(id, points).second) << "two curves for " << id.first << " of " << id.second;
  }
  return curves;
}

// What the SVG should hold for `keys` (empty: every key but the bookkeeping
// ones) of the runs in `work_dirs` (run name -> work dir).
std::map<CurveId, int> expected_curves(const std::map<std::string, std::string>& work_dirs,
                                       const std::set<std::string>& keys) {
  const std::set<std::string> bookkeeping{"iteration", "epoch", "data_time", "time", "eta_seconds"};
  std::map<CurveId, int> expected;
  for (const auto& [run, dir] : work_dirs) {
    for (const auto& [key, count] : finite_values_per_key(dir + "/metrics.jsonl")) {
      const bool wanted = keys.empty() ? bookkeeping.count(key) == 0 : keys.count(key) > 0;
      if (wanted) expected[{key, run}] = count;
    }
  }
  return expected;
}

TEST(PlotCommand, DrawsEveryKeyOfADdpRunAndAnEvaluatedRun) {
  testing::TempDir dir;
  const std::string ddp = dir.file("ddp");
  const std::string evaluated = dir.file("evaluated");
  // The small job, DDP on 2 ranks, 8 iterations logged every 2.
  auto first = train_on_two_ranks(testing::write_small_job(dir), ddp,
                                  {testing::ddp_strategy_line(), "train_cfg.max_iters=8",
                                   "default_hooks.logger.interval=2", "default_hooks.checkpoint.interval=8"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // DistributedRun's job: DDP on 2 ranks, evaluated at iterations 6 and 12.
  auto second = train_on_two_ranks(testing::source_dir() + "/tests/e2e/distributed_run.yaml", evaluated,
                                   {"default_hooks.logger.interval=2"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::map<std::string, std::string> runs{{"ddp", ddp}, {"evaluated", evaluated}};

  // Named keys, in the order given.
  auto plotted = lockstep_plot({ddp, evaluated, "--keys", "loss,lr,accuracy/top1", "-o", dir.file("named.svg")});
  ASSERT_EQ(plotted.exit_code, 0) << plotted.output;
  EXPECT_NE(plotted.output.find("Wrote " + dir.file("named.svg") + " (3 keys, 2 runs)"), std::string::npos)
      << plotted.output;
  const auto expected = expected_curves(runs, {"loss", "lr", "accuracy/top1"});
  ASSERT_EQ(expected.size(), 5u) << "accuracy/top1 only in the evaluated run";  // loss, lr x 2 runs + accuracy
  for (const auto& [id, count] : expected) EXPECT_GT(count, 0) << id.first << " of " << id.second;
  EXPECT_GE(expected.at({"accuracy/top1", "evaluated"}), 2);  // evaluated twice
  EXPECT_EQ(curves_in_svg(dir.file("named.svg")), expected);

  // Default keys, smoothed: every key but the bookkeeping ones, the same point counts.
  auto smoothed = lockstep_plot({ddp, evaluated, "--smooth", "3", "--title", "ddp & evaluated", "-o",
                                 dir.file("all.svg")});
  ASSERT_EQ(smoothed.exit_code, 0) << smoothed.output;
  EXPECT_EQ(curves_in_svg(dir.file("all.svg")), expected_curves(runs, {}));
  const std::string svg = testing::read_file(dir.file("all.svg"));
  EXPECT_NE(svg.find("moving average of 3 points"), std::string::npos);
  EXPECT_NE(svg.find("ddp &amp; evaluated"), std::string::npos);

  // A key no run has: named, with the keys there are.
  auto unknown = lockstep_plot({ddp, evaluated, "--keys", "loss,accuracy/top5", "-o", dir.file("unknown.svg")});
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_NE(unknown.output.find("lockstep: error: --keys: no run has the key \"accuracy/top5\""), std::string::npos)
      << unknown.output;
  EXPECT_NE(unknown.output.find("accuracy/top1, accuracy/top3"), std::string::npos) << unknown.output;
  EXPECT_FALSE(testing::file_exists(dir.file("unknown.svg")));
}

TEST(PlotCommand, ErrorsNameTheWorkDirTheKeyAndTheLine) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.file("run"));
  testing::write_file(dir.file("run/metrics.jsonl"),
                      "{\"iteration\": 0, \"loss\": 1.0}\n{\"iteration\": 1, \"loss\": \"NaN\"}\n"
                      "{\"iteration\": 2, \"loss\": 0.5}\n");

  // Each bad input: exit 1, a message that names it, no SVG written.
  std::filesystem::create_directories(dir.file("bad"));
  testing::write_file(dir.file("bad/metrics.jsonl"),
                      "{\"iteration\": 0, \"loss\": 1.0}\n{\"iteration\": 1, \"loss\": 0.9}\n{\"iteration\": 2, \"lo\n");
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad_inputs{
      {{dir.file("run"), dir.file("no_such_run")}, "lockstep: error: " + dir.file("no_such_run") + ": no such work dir"},
      {{dir.file("run"), "--keys", "los"}, "no run has the key \"los\" (did you mean 'loss'?)"},
      {{dir.file("run"), "--smooth", "0"}, "lockstep: error: --smooth must be at least 1"},
      {{dir.file("run"), dir.file("bad")}, "lockstep: error: " + dir.file("bad/metrics.jsonl") + ":3: not JSON"},
  };
  for (auto [args, message] : bad_inputs) {
    args.insert(args.end(), {"-o", dir.file("out.svg")});
    auto result = lockstep_plot(args);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(message), std::string::npos) << result.output;
    EXPECT_FALSE(testing::file_exists(dir.file("out.svg"))) << message;
  }

  // The file itself works as well as its work dir; the NaN is not drawn.
  auto direct = lockstep_plot({dir.file("run/metrics.jsonl"), "-o", dir.file("direct.svg")});
  ASSERT_EQ(direct.exit_code, 0) << direct.output;
  EXPECT_EQ(curves_in_svg(dir.file("direct.svg")), (std::map<CurveId, int>{{{"loss", "run"}, 2}}));
}

TEST(PlotCommand, PngNeedsRsvgConvert) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.file("run"));
  testing::write_file(dir.file("run/metrics.jsonl"), "{\"iteration\": 0, \"loss\": 1.0}\n{\"iteration\": 1, \"loss\": 0.5}\n");
  // No rsvg-convert on PATH: an error that says what to install, after writing the SVG.
  std::filesystem::create_directories(dir.file("empty_path"));
  auto without = lockstep_plot({dir.file("run"), "--png", "-o", dir.file("without.svg")}, {"PATH=" + dir.file("empty_path")});
  EXPECT_EQ(without.exit_code, 1) << without.output;
  EXPECT_NE(without.output.find("rsvg-convert"), std::string::npos) << without.output;
  EXPECT_NE(without.output.find("librsvg2-bin"), std::string::npos) << without.output;
  EXPECT_NE(without.output.find("the SVG was written to " + dir.file("without.svg")), std::string::npos)
      << without.output;
  EXPECT_TRUE(testing::file_exists(dir.file("without.svg")));
  EXPECT_FALSE(testing::file_exists(dir.file("without.png")));

  if (testing::run_command({"sh", "-c", "command -v rsvg-convert"}, {}, 30).exit_code != 0) {
    GTEST_SKIP() << "no rsvg-convert here (Debian package librsvg2-bin): the PNG itself is not checked";
  }
  auto with = lockstep_plot({dir.file("run"), "--png", "-o", dir.file("with.svg")});
  ASSERT_EQ(with.exit_code, 0) << with.output;
  EXPECT_NE(with.output.find("Wrote " + dir.file("with.png")), std::string::npos) << with.output;
  EXPECT_EQ(testing::read_file(dir.file("with.png")).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

}  // namespace
}  // namespace plot_test
}  // namespace lockstep
