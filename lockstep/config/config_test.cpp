// Loading, `_base_` inheritance, `_delete_`, error messages and conversions.
// Line numbers refer to the fixtures in testdata/ (see `cat -n`).
#include "lockstep/config/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lockstep/config/config_test_util.h"
#include "lockstep/config/key_usage.h"

namespace lockstep {
namespace {

using config_test::error_of;
using config_test::testdata;

std::vector<std::string> keys_of(const Config& config) { return config.keys(); }

TEST(ConfigLoadTest, GrandchildMergesThreeFilesAndKeepsEachValuesLine) {
  Config cfg = load_config(testdata("grandchild.yaml"));
  const std::string base = testdata("base.yaml");
  const std::string child = testdata("child.yaml");
  const std::string grandchild = testdata("grandchild.yaml");

  EXPECT_EQ(keys_of(cfg), (std::vector<std::string>{"model", "optimizer", "max_epochs",
                                                    "param_scheduler", "work_dir", "train_dataloader"}));
  Config model = cfg.at("model");
  EXPECT_EQ(model.get<std::string>("type"), "MLP");
  EXPECT_EQ(model.get<int>("hidden"), 256);
  EXPECT_DOUBLE_EQ(model.get<double>("dropout"), 0.5);
  EXPECT_EQ(model.where("type"), base + ":3 (key model.type)");
  EXPECT_EQ(model.where("hidden"), child + ":3 (key model.hidden)");
  EXPECT_EQ(model.where("dropout"), grandchild + ":3 (key model.dropout)");
  // The merged map stays the base's node.
  EXPECT_EQ(model.where(), base + ":2 (key model)");

  EXPECT_EQ(cfg.get<int>("max_epochs"), 20);
  EXPECT_EQ(cfg.where("max_epochs"), child + ":8 (key max_epochs)");
  EXPECT_EQ(cfg.at("param_scheduler").at(1).where("T_max"), base + ":15 (key param_scheduler.1.T_max)");
  EXPECT_EQ(cfg.at("train_dataloader").get<int>("batch_size"), 64);
  EXPECT_TRUE(cfg.at("train_dataloader").get<bool>("shuffle"));
  EXPECT_FALSE(cfg.has("_base_"));
}

TEST(ConfigLoadTest, DeleteReplacesTheInheritedMapAndDisappears) {
  Config cfg = load_config(testdata("grandchild.yaml"));
  Config optimizer = cfg.at("optimizer");
  EXPECT_EQ(keys_of(optimizer), (std::vector<std::string>{"type", "lr"}));
  EXPECT_EQ(optimizer.get<std::string>("type"), "Adam");
  EXPECT_DOUBLE_EQ(optimizer.get<double>("lr"), 0.001);
  EXPECT_EQ(optimizer.where(), testdata("child.yaml") + ":4 (key optimizer)");
  // SGD's momentum came from the base and must be gone, not merged in.
  EXPECT_EQ(error_of([&] { optimizer.at("momentum"); }),
            testdata("child.yaml") + ":4 (key optimizer): missing key 'momentum'");
}

TEST(ConfigLoadTest, SeveralBasesMergeInOrderThenTheFileItself) {
  Config cfg = load_config(testdata("two_bases.yaml"));
  EXPECT_EQ(cfg.get<int>("max_epochs"), 30);       // runtime.yaml beats base.yaml
  EXPECT_EQ(cfg.get<int>("log_interval"), 10);     // the file beats both
  EXPECT_EQ(cfg.at("model").get<int>("hidden"), 512);
  EXPECT_EQ(cfg.at("model").get<std::string>("type"), "MLP");  // maps merge across bases
  EXPECT_EQ(cfg.at("model").get<std::string>("activation"), "relu");
  EXPECT_EQ(cfg.where("max_epochs"), testdata("runtime.yaml") + ":1 (key max_epochs)");
  EXPECT_EQ(keys_of(cfg), (std::vector<std::string>{"model", "optimizer", "max_epochs", "param_scheduler",
                                                    "work_dir", "log_interval"}));
}

TEST(ConfigLoadTest, BasePathsAreRelativeToTheIncludingFile) {
  // nested/leaf.yaml -> ../child.yaml -> base.yaml (next to child, not to leaf).
  Config cfg = load_config(testdata("nested/leaf.yaml"));
  EXPECT_EQ(cfg.get<std::string>("work_dir"), "runs/leaf");
  EXPECT_EQ(cfg.at("model").get<std::string>("type"), "MLP");
  EXPECT_EQ(cfg.at("model").where("type"), testdata("base.yaml") + ":3 (key model.type)");
}

TEST(ConfigLoadTest, DiamondIncludesAreNotACycle) {
  testing::TempDir dir;
  testing::write_file(dir.file("bottom.yaml"), "a: 1\nb: 1\n");
  testing::write_file(dir.file("left.yaml"), "_base_: bottom.yaml\na: 2\n");
  testing::write_file(dir.file("right.yaml"), "_base_: " + dir.file("bottom.yaml") + "\nb: 3\n");
  testing::write_file(dir.file("top.yaml"), "_base_: [left.yaml, right.yaml]\n");
  Config cfg = load_config(dir.file("top.yaml"));
  // right.yaml re-reads bottom (a: 1) but only sets b; its a: 1 comes later than left's a: 2.
  EXPECT_EQ(cfg.get<int>("a"), 1);
  EXPECT_EQ(cfg.get<int>("b"), 3);
}

TEST(ConfigLoadTest, IncludeCycleNamesTheChain) {
  const std::string a = testdata("cycle_a.yaml");
  const std::string b = testdata("cycle_b.yaml");
  EXPECT_EQ(error_of([&] { load_config(a); }),
            b + ":1: _base_ include cycle: " + a + " -> " + b + " -> " + a);
}

TEST(ConfigLoadTest, MissingBaseNamesTheFileAndWhoIncludedIt) {
  EXPECT_EQ(error_of([] { load_config(testdata("missing_base.yaml")); }),
            "cannot open config file '" + testdata("does_not_exist.yaml") + "' (named in _base_ at " +
                testdata("missing_base.yaml") + ":2): no such file");
}

TEST(ConfigLoadTest, MissingOrUnreadableFileIsNamed) {
  EXPECT_EQ(error_of([] { load_config(testdata("nope.yaml")); }),
            "cannot open config file '" + testdata("nope.yaml") + "': no such file");
  EXPECT_EQ(error_of([] { load_config(testdata("nested")); }),
            "cannot open config file '" + testdata("nested") + "': not a regular file");
}

TEST(ConfigLoadTest, MalformedYamlGivesFileLineColumnAndYamlCppsMessage) {
  EXPECT_EQ(error_of([] { load_config(testdata("malformed.yaml")); }),
            testdata("malformed.yaml") + ":4:20: illegal map value");
  EXPECT_EQ(error_of([] { parse_config("a: [1, 2\nb: 3\n", "inline.yaml"); }),
            "inline.yaml:2:2: end of sequence flow not found");
}

TEST(ConfigLoadTest, StructuralMistakesAreReportedWithTheirLine) {
  EXPECT_EQ(error_of([] { parse_config("a: 1\nb: 2\na: 3\n", "dup.yaml"); }),
            "dup.yaml:3: duplicate key 'a' (first at line 1)");
  EXPECT_EQ(error_of([] { parse_config("x:\n  _delete_: maybe\n", "d.yaml"); }),
            "d.yaml:2 (key x._delete_): _delete_ must be true or false, got 'maybe'");
  EXPECT_EQ(error_of([] { parse_config("_base_: {a: 1}\n", "b.yaml"); }),
            "b.yaml:1 (key _base_): _base_ holds a file name or a list of file names, got a map");
  EXPECT_EQ(error_of([] { parse_config("[1, 2]: x\n", "k.yaml"); }),
            "k.yaml:1: a map key must be a plain text, got a map or sequence");
  testing::TempDir dir;
  testing::write_file(dir.file("list.yaml"), "- 1\n- 2\n");
  EXPECT_EQ(error_of([&] { load_config(dir.file("list.yaml")); }),
            dir.file("list.yaml") + ": a config file holds a map at the top, got a sequence");
}

TEST(ConfigLoadTest, EmptyFileIsAnEmptyMapAndParseKeepsTheSourceName) {
  testing::TempDir dir;
  testing::write_file(dir.file("empty.yaml"), "# nothing\n");
  Config empty = load_config(dir.file("empty.yaml"));
  EXPECT_TRUE(empty.is_map());
  EXPECT_EQ(empty.size(), 0u);
  Config parsed = parse_config("a:\n  b: 1\n", "cli");
  EXPECT_EQ(parsed.at("a").where("b"), "cli:2 (key a.b)");
  EXPECT_EQ(parsed.at("a").at("b").source().column, 3);
  EXPECT_EQ(parsed.where(), "cli");
}

TEST(ConfigLoadTest, ParsedTextResolvesBasesNextToItsSourceName) {
  Config cfg = parse_config("_base_: base.yaml\nmax_epochs: 1\n", testdata("inline.yaml"));
  EXPECT_EQ(cfg.get<int>("max_epochs"), 1);
  EXPECT_EQ(cfg.where("max_epochs"), testdata("inline.yaml") + ":2 (key max_epochs)");
  EXPECT_EQ(cfg.at("model").where("type"), testdata("base.yaml") + ":3 (key model.type)");
}

TEST(ConfigLoadTest, DeleteFalseMergesAndAnchorsResolve) {
  Config cfg = parse_config(
      "defaults: &d {lr: 0.1, momentum: 0.9}\n"
      "optimizer: *d\n"
      "nested:\n  _delete_: false\n  x: 1\n",
      "a.yaml");
  EXPECT_DOUBLE_EQ(cfg.at("optimizer").get<double>("momentum"), 0.9);
  EXPECT_EQ(keys_of(cfg.at("nested")), std::vector<std::string>{"x"});
}

// ---- access errors and where() ---------------------------------------------

TEST(ConfigErrorTest, MissingKeyNamesTheMapsLineAndPath) {
  Config cfg = load_config(testdata("types.yaml"));
  const std::string file = testdata("types.yaml");
  EXPECT_EQ(error_of([&] { cfg.at("optimizer").at("momentum"); }),
            file + ":1 (key optimizer): missing key 'momentum'");
  EXPECT_EQ(error_of([&] { cfg.get<int>("epochs"); }), file + ": missing key 'epochs'");
  // Through an absent map, the first absent key is the one reported.
  EXPECT_EQ(error_of([&] { cfg.child("model").at("type"); }), file + ": missing key 'model'");
  EXPECT_EQ(error_of([&] { cfg.child("model").get<int>("depth"); }), file + ": missing key 'model'");
  EXPECT_EQ(error_of([&] { cfg.child("model").as<int>(); }), file + ": missing key 'model'");
}

TEST(ConfigErrorTest, WhereFormatsFileLineAndKeyPath) {
  Config cfg = load_config(testdata("types.yaml"));
  const std::string file = testdata("types.yaml");
  Config optimizer = cfg.at("optimizer");
  EXPECT_EQ(optimizer.at("lr").where(), file + ":2 (key optimizer.lr)");
  EXPECT_EQ(optimizer.where("lr"), file + ":2 (key optimizer.lr)");
  // An absent key is placed at its map.
  EXPECT_EQ(optimizer.where("absent"), file + ":1 (key optimizer.absent)");
  EXPECT_EQ(optimizer.child("absent").where(), file + ":1 (key optimizer.absent)");
  EXPECT_EQ(optimizer.at("lr").path(), "optimizer.lr");
  EXPECT_EQ(optimizer.at("lr").source().file, file);
  EXPECT_EQ(optimizer.at("lr").source().line, 2);
  EXPECT_EQ(cfg.where(), file);
}

TEST(ConfigErrorTest, WrongShapeAccessIsAnErrorNotACrash) {
  Config cfg = load_config(testdata("types.yaml"));
  const std::string file = testdata("types.yaml");
  EXPECT_EQ(error_of([&] { cfg.at("optimizer").at("lr").at("x"); }),
            file + ":2 (key optimizer.lr): expected a map with key 'x', got 'fast'");
  EXPECT_EQ(error_of([&] { cfg.at("optimizer").at(size_t{0}); }),
            file + ":1 (key optimizer): expected a sequence, got a map");
  EXPECT_EQ(error_of([&] { cfg.at("ints").at(5); }),
            file + ":9 (key ints): index 5 is out of range for a sequence of 5 entries");
  EXPECT_FALSE(cfg.at("ints").has("x"));
  EXPECT_TRUE(cfg.at("ints").keys().empty());
  EXPECT_EQ(cfg.at("optimizer").at("lr").size(), 0u);
  EXPECT_EQ(cfg.at("optimizer").size(), 6u);
}

// ---- as<T>() ---------------------------------------------------------------

TEST(ConfigConvertTest, WrongTypesNameTheKeyAndTheText) {
  Config cfg = load_config(testdata("types.yaml"));
  const std::string file = testdata("types.yaml");
  Config optimizer = cfg.at("optimizer");
  EXPECT_EQ(error_of([&] { optimizer.get<double>("lr"); }),
            file + ":2 (key optimizer.lr): expected a number, got 'fast'");
  EXPECT_EQ(error_of([&] { optimizer.get<int>("steps"); }),
            file + ":3 (key optimizer.steps): expected an integer, got '1.5'");
  EXPECT_EQ(error_of([&] { optimizer.get<int>("big"); }),
            file + ":4 (key optimizer.big): expected an integer in [-2147483648, 2147483647], got '3000000000'");
  EXPECT_EQ(optimizer.get<int64_t>("big"), 3000000000LL);
  EXPECT_EQ(error_of([&] { optimizer.get<bool>("nesterov"); }),
            file + ":6 (key optimizer.nesterov): expected a boolean (true/false), got 'maybe'");
  EXPECT_EQ(error_of([&] { optimizer.get<std::vector<double>>("betas"); }),
            file + ":5 (key optimizer.betas.1): expected a number, got 'slow'");
  EXPECT_EQ(error_of([&] { optimizer.get<std::vector<double>>("lr"); }),
            file + ":2 (key optimizer.lr): expected a sequence of numbers, got 'fast'");
  EXPECT_EQ(error_of([&] { cfg.get<int>("empty"); }), file + ":10 (key empty): expected an integer, got null");
  EXPECT_EQ(error_of([&] { cfg.get<std::string>("optimizer"); }),
            file + ":1 (key optimizer): expected a string, got a map");
}

TEST(ConfigConvertTest, SequencesBooleansIntegersAndFallbacks) {
  Config cfg = load_config(testdata("types.yaml"));
  EXPECT_EQ(cfg.get<std::vector<bool>>("flags"), (std::vector<bool>{true, false, true, false, true, false}));
  EXPECT_EQ(cfg.get<std::vector<int>>("ints"), (std::vector<int>{1, -2, 16, 15, 7}));
  EXPECT_EQ(cfg.get<std::vector<int64_t>>("ints"), (std::vector<int64_t>{1, -2, 16, 15, 7}));
  EXPECT_EQ(cfg.get<std::vector<std::string>>("ints"),
            (std::vector<std::string>{"1", "-2", "0x10", "0o17", "+7"}));
  // The text decides: a quoted "0.5" still reads as a number.
  EXPECT_DOUBLE_EQ(cfg.at("optimizer").get<double>("name"), 0.5);
  EXPECT_EQ(cfg.at("optimizer").get<std::string>("name"), "0.5");
  EXPECT_EQ(cfg.get<int>("empty", 7), 7);  // null counts as absent for a fallback
  EXPECT_EQ(cfg.get<int>("absent", 3), 3);
  EXPECT_EQ(cfg.get<std::string>("absent", "x"), "x");
  EXPECT_TRUE(cfg.child("empty").is_null());
}

// Reads `text` as T through a one-key config.
template <typename T>
T read_as(const std::string& text) {
  return parse_config("v: " + text, "n.yaml").get<T>("v");
}

TEST(ConfigConvertTest, NumbersFollowYamlCoreSchema) {
  EXPECT_DOUBLE_EQ(read_as<double>("1e-4"), 1e-4);
  EXPECT_DOUBLE_EQ(read_as<double>(".5"), 0.5);
  EXPECT_DOUBLE_EQ(read_as<double>("+1.5"), 1.5);
  EXPECT_DOUBLE_EQ(read_as<double>("-2."), -2.0);
  EXPECT_DOUBLE_EQ(read_as<double>("3"), 3.0);
  EXPECT_DOUBLE_EQ(read_as<double>("0x10"), 16.0);
  EXPECT_EQ(read_as<double>(".inf"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(read_as<double>("-.Inf"), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(read_as<double>(".nan")));
  EXPECT_FLOAT_EQ(read_as<float>("0.25"), 0.25f);
  for (const char* bad : {"1,5", "nan", "inf", "1e", "--1", "1.2.3", "0x", "e5", "'1 2'"}) {
    EXPECT_EQ(error_of([&] { read_as<double>(bad); }),
              std::string("n.yaml:1 (key v): expected a number, got '") +
                  (bad[0] == '\'' ? "1 2" : bad) + "'")
        << bad;
  }
  EXPECT_EQ(error_of([] { read_as<double>("1e999"); }),
            "n.yaml:1 (key v): expected a number in the range of a double, got '1e999'");
  EXPECT_EQ(error_of([] { read_as<float>("1e39"); }),
            "n.yaml:1 (key v): expected a number in the range of a float, got '1e39'");
  EXPECT_DOUBLE_EQ(read_as<double>("1e39"), 1e39);
}

TEST(ConfigConvertTest, IntegersRejectFractionsAndOverflow) {
  EXPECT_EQ(read_as<int64_t>("-9223372036854775808"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(read_as<int64_t>("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(read_as<int>("-2147483648"), std::numeric_limits<int>::min());
  EXPECT_EQ(read_as<int>("0o777"), 511);
  EXPECT_EQ(read_as<int>("-0x1F"), -31);
  EXPECT_EQ(error_of([] { read_as<int64_t>("9223372036854775808"); }),
            "n.yaml:1 (key v): expected an integer in [-9223372036854775808, 9223372036854775807], "
            "got '9223372036854775808'");
  EXPECT_EQ(error_of([] { read_as<int64_t>("99999999999999999999999"); }),
            "n.yaml:1 (key v): expected an integer in [-9223372036854775808, 9223372036854775807], "
            "got '99999999999999999999999'");
  EXPECT_EQ(error_of([] { read_as<int>("2147483648"); }),
            "n.yaml:1 (key v): expected an integer in [-2147483648, 2147483647], got '2147483648'");
  for (const char* bad : {"1.0", "1e3", "0x1G", "12abc", "1 2", "true", "0o8"}) {
    EXPECT_NE(error_of([&] { read_as<int>(bad); }).find("expected an integer, got"), std::string::npos) << bad;
  }
}

TEST(ConfigConvertTest, BooleansAcceptYamlWordsOnly) {
  for (const char* yes : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"}) {
    EXPECT_TRUE(read_as<bool>(yes)) << yes;
  }
  for (const char* no : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"}) {
    EXPECT_FALSE(read_as<bool>(no)) << no;
  }
  for (const char* bad : {"1", "0", "tRUE", "y", "maybe"}) {
    EXPECT_EQ(error_of([&] { read_as<bool>(bad); }),
              std::string("n.yaml:1 (key v): expected a boolean (true/false), got '") + bad + "'");
  }
}

TEST(ConfigKeysTest, CheckKnownKeysNamesTheKeyItsLineAndTheNearestKnownKey) {
  Config config = parse_config("model: {type: MLP}\ntrian_cfg: {max_iters: 3}\n", "run.yaml");
  const std::vector<std::string> known{"model", "train_cfg", "optim_wrapper"};
  EXPECT_EQ(error_of([&] { check_known_keys(config, known, "top-level key"); }),
            "run.yaml:2 (key trian_cfg): unknown top-level key (did you mean 'train_cfg'?); known keys: model, "
            "train_cfg, optim_wrapper");
  config.apply_override("foo=3");
  const std::string both = error_of([&] { check_known_keys(config, known, "top-level key"); });
  EXPECT_EQ(both.rfind("2 unknown top-level keys:", 0), 0u) << both;
  EXPECT_NE(both.find("--set (key foo): unknown top-level key; known keys"), std::string::npos) << both;
  check_known_keys(parse_config("model: 1\n"), known, "top-level key");  // all known: no error
}

TEST(ConfigKeysTest, UnreadKeysSuggestTheNearestKeyTheReaderAskedFor) {
  Config config = parse_config("optimizer: {lr: 0.1, momentun: 0.9}\n", "run.yaml");
  Config optimizer = config.at("optimizer");
  optimizer.get<double>("lr");
  optimizer.get<double>("momentum", 0.0);
  const std::string message = error_of([&] { check_all_used(optimizer, "SGD"); });
  EXPECT_NE(message.find("(key optimizer.momentun): unknown key for SGD (did you mean 'momentum'?); it reads: "),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace lockstep
