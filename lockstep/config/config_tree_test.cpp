// Read tracking (check_all_used), building and editing trees in code, clone()
// and to_yaml().
#include <gtest/gtest.h>

#include "lockstep/config/config.h"
#include "lockstep/config/config_test_util.h"
#include "lockstep/config/key_usage.h"

namespace lockstep {
namespace {

using config_test::error_of;
using config_test::testdata;

const char* const kSgd =
    "optimizer:\n"         // 1
    "  type: SGD\n"        // 2
    "  lr: 0.1\n"          // 3
    "  momentun: 0.9\n"    // 4
    "  nesterov: true\n"   // 5
    "  paramwise:\n"       // 6
    "    norm_decay: 0\n"  // 7
    "    bias_lr: 2\n"     // 8
    "extra:\n"             // 9
    "  a: 1\n";            // 10

// What an SGD factory would read.
void read_like_sgd(const Config& optimizer) {
  optimizer.get<std::string>("type");
  optimizer.get<double>("lr");
  optimizer.get<double>("momentum", 0.0);
  optimizer.get<double>("weight_decay", 0.0);
  optimizer.has("nesterov");
}

TEST(ConfigTrackingTest, OneUnreadKeyNamesItsLineAndTheKeysThatWereRead) {
  Config cfg = parse_config(kSgd, "t.yaml");
  Config optimizer = cfg.at("optimizer");
  read_like_sgd(optimizer);
  mark_used(optimizer.at("paramwise"));
  EXPECT_EQ(error_of([&] { check_all_used(optimizer, "SGD"); }),
            "t.yaml:4 (key optimizer.momentun): unknown key for SGD (did you mean 'momentum'?); it reads: lr, momentum, nesterov, "
            "paramwise, type, weight_decay");
}

TEST(ConfigTrackingTest, EveryUnreadKeyIsListedRecursivelyOncePerSubtree) {
  Config cfg = parse_config(kSgd, "t.yaml");
  Config optimizer = cfg.at("optimizer");
  read_like_sgd(optimizer);
  optimizer.at("paramwise").get<int>("bias_lr");
  EXPECT_EQ(error_of([&] { check_all_used(cfg, "the trainer"); }),
            "3 unknown keys for the trainer:\n"
            "  t.yaml:4 (key optimizer.momentun): unknown key for the trainer (did you mean 'momentum'?); it reads: lr, momentum, "
            "nesterov, paramwise, type, weight_decay\n"
            "  t.yaml:7 (key optimizer.paramwise.norm_decay): unknown key for the trainer; it reads: bias_lr\n"
            "  t.yaml:9 (key extra): unknown key for the trainer; it reads: optimizer");
}

TEST(ConfigTrackingTest, AccessorsMarkAndKeysDoesNot) {
  Config cfg = parse_config("a: 1\nb: 2\nc: 3\nd: 4\ne: [1, 2]\n", "m.yaml");
  cfg.keys();
  cfg.size();
  cfg.where("a");
  EXPECT_NE(error_of([&] { check_all_used(cfg, "x"); }).find("5 unknown keys"), std::string::npos);
  EXPECT_TRUE(cfg.has("a"));
  cfg.child("b");
  cfg.at("c");
  cfg.get<int>("d");
  cfg.at("e").at(0);
  EXPECT_EQ(error_of([&] { check_all_used(cfg, "x"); }), "m.yaml:5 (key e.1): entry never read by x");
  cfg.get<std::vector<int>>("e");
  EXPECT_NO_THROW(check_all_used(cfg, "x"));
}

TEST(ConfigTrackingTest, MarkUsedCoversASubtreeAndNothingReadSaysSo) {
  Config cfg = parse_config(kSgd, "t.yaml");
  EXPECT_EQ(error_of([&] { check_all_used(cfg.at("extra"), "E"); }),
            "t.yaml:10 (key extra.a): unknown key for E; it reads: (no keys here)");
  mark_used(cfg);
  EXPECT_NO_THROW(check_all_used(cfg, "all"));
}

TEST(ConfigTrackingTest, CloneIsDeepWithItsOwnTracking) {
  Config cfg = parse_config(kSgd, "t.yaml");
  Config copy = cfg.clone();
  mark_used(copy);
  EXPECT_THROW(check_all_used(cfg, "original"), Error);
  mark_used(cfg);
  Config fresh = cfg.clone();
  EXPECT_THROW(check_all_used(fresh, "fresh"), Error);
  EXPECT_EQ(fresh.at("optimizer").where("lr"), "t.yaml:3 (key optimizer.lr)");

  copy.at("optimizer").set("lr", Config::scalar("0.5"));
  copy.at("optimizer").at("paramwise").erase("bias_lr");
  EXPECT_DOUBLE_EQ(cfg.at("optimizer").get<double>("lr"), 0.1);
  EXPECT_TRUE(cfg.at("optimizer").at("paramwise").has("bias_lr"));
  EXPECT_FALSE(same_node(copy, cfg));
  EXPECT_TRUE(same_node(cfg.at("optimizer"), cfg.at("optimizer")));
}

// ---- building in code --------------------------------------------------------

TEST(ConfigBuildTest, SetAdoptsAFreeNodeAndClonesOneThatSitsInATree) {
  Config root = Config::map();
  Config optimizer = Config::map();
  optimizer.set("lr", Config::scalar("0.1"));
  root.set("optimizer", optimizer);
  optimizer.set("momentum", Config::scalar("0.9"));  // still the node inside root
  EXPECT_EQ(root.at("optimizer").keys(), (std::vector<std::string>{"lr", "momentum"}));
  EXPECT_EQ(root.at("optimizer").at("lr").path(), "optimizer.lr");
  EXPECT_EQ(root.at("optimizer").where("lr"), "(key optimizer.lr)");

  root.set("copy", root.at("optimizer"));
  root.at("copy").set("lr", Config::scalar("0.2"));
  EXPECT_DOUBLE_EQ(root.at("optimizer").get<double>("lr"), 0.1);
  EXPECT_EQ(root.at("copy").at("momentum").path(), "copy.momentum");

  // A node set into itself is copied, so the tree stays a tree.
  optimizer.set("self", optimizer);
  EXPECT_EQ(root.at("optimizer").at("self").keys(), (std::vector<std::string>{"lr", "momentum"}));
  EXPECT_FALSE(root.to_yaml().empty());
}

TEST(ConfigBuildTest, SequencesNullPromotionAndErase) {
  Config root;
  EXPECT_TRUE(root.is_null());
  root.set("list", Config::sequence());
  root.at("list").push_back(Config::scalar("a"));
  root.at("list").push_back(Config::map());
  root.at("list").at(1).set("k", Config::scalar("v"));
  EXPECT_EQ(root.at("list").at(1).at("k").path(), "list.1.k");
  Config tail;
  tail.push_back(Config::scalar("1"));
  EXPECT_TRUE(tail.is_sequence());

  root.set("gone", Config::scalar("x"));
  root.erase("gone");
  root.erase("never_there");
  EXPECT_EQ(root.keys(), std::vector<std::string>{"list"});

  EXPECT_EQ(error_of([&] { root.at("list").set("k", Config::scalar("v")); }),
            "(key list): cannot set key 'k' on a sequence");
  EXPECT_EQ(error_of([&] { root.at("list").at(0).push_back(Config()); }),
            "(key list.0): cannot append to a scalar");
  EXPECT_EQ(error_of([&] { root.at("list").erase("k"); }), "(key list): cannot erase key 'k' from a sequence");
}

// ---- to_yaml -----------------------------------------------------------------

TEST(ConfigDumpTest, BlockStyleInInsertionOrder) {
  Config cfg = load_config(testdata("grandchild.yaml"));
  EXPECT_EQ(cfg.to_yaml(),
            "model:\n"
            "  type: MLP\n"
            "  hidden: 256\n"
            "  dropout: 0.5\n"
            "optimizer:\n"
            "  type: Adam\n"
            "  lr: 0.001\n"
            "max_epochs: 20\n"
            "param_scheduler:\n"
            "  - type: LinearLR\n"
            "    end: 5\n"
            "  - type: CosineAnnealingLR\n"
            "    T_max: 50\n"
            "work_dir: runs/base\n"
            "train_dataloader:\n"
            "  batch_size: 64\n"
            "  shuffle: yes\n");
}

TEST(ConfigDumpTest, StringsThatWouldChangeMeaningAreQuoted) {
  Config cfg = parse_config(
      "version: '1.10'\nflag: 'yes'\nword: \"null\"\nplain: 1e-4\nempty: ''\nnothing:\n"
      "colon: 'a: b'\nm: {}\nl: []\n",
      "q.yaml");
  EXPECT_EQ(cfg.to_yaml(),
            "version: \"1.10\"\n"
            "flag: \"yes\"\n"
            "word: \"null\"\n"
            "plain: 1e-4\n"
            "empty: \"\"\n"
            "nothing: null\n"
            "colon: \"a: b\"\n"
            "m: {}\n"
            "l: []\n");
}

void expect_same_tree(const Config& a, const Config& b) {
  ASSERT_EQ(a.kind(), b.kind()) << a.where();
  EXPECT_EQ(a.text(), b.text()) << a.where();
  ASSERT_EQ(a.keys(), b.keys()) << a.where();
  for (const auto& key : a.keys()) expect_same_tree(a.at(key), b.at(key));
  if (!a.is_sequence()) return;
  ASSERT_EQ(a.size(), b.size()) << a.where();
  for (size_t i = 0; i < a.size(); ++i) expect_same_tree(a.at(i), b.at(i));
}

TEST(ConfigDumpTest, ParseOfDumpRoundTrips) {
  const char* const text =
      "strings: ['0.5', 'yes', 'y', 'null', '~', '', ' lead', 'trail ', 'a: b', '#hash', 'a #b',\n"
      "  \"multi\\nline\", \"tab\\there\", '- dash', '[x]', '{x}', '&a', '*a', '!t', '%p', '@a', '`b',\n"
      "  'é', '1_000', '12:30', '-', '?', ':', \"q'\", 'd\"', '0x1F', '.inf', '+1']\n"
      "plain: [1e-4, .inf, 0x10, true, On, text with spaces]\n"
      "nulls: [~, null]\n"
      "nested: [[1, [2]], {a: {b: []}}, {}]\n"
      "'null': key named null\n"
      "'': empty key\n"
      "'a: b': colon key\n"
      "'1': numeric key\n";
  Config original = parse_config(text, "r.yaml");
  std::string dumped = original.to_yaml();
  Config reread = parse_config(dumped, "dump.yaml");
  expect_same_tree(original, reread);
  EXPECT_EQ(reread.to_yaml(), dumped);
  // A scalar made in code whose text is a null word stays a scalar.
  Config root = Config::map();
  root.set("word", Config::scalar("null"));
  EXPECT_TRUE(parse_config(root.to_yaml()).at("word").is_scalar());
}

TEST(ConfigDumpTest, NonMapRoots) {
  EXPECT_EQ(Config().to_yaml(), "null\n");
  EXPECT_EQ(Config::scalar("x").to_yaml(), "x\n");
  EXPECT_EQ(Config::map().to_yaml(), "{}\n");
  EXPECT_EQ(parse_config("[1, 2]").to_yaml(), "- 1\n- 2\n");
}

}  // namespace
}  // namespace lockstep
