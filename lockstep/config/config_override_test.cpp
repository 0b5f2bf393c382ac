// Config::apply_override: `--set a.b.c=value` from the command line.
#include <gtest/gtest.h>

#include "lockstep/config/config.h"
#include "lockstep/config/config_test_util.h"

namespace lockstep {
namespace {

using config_test::error_of;
using config_test::testdata;

class ConfigOverrideTest : public ::testing::Test {
 protected:
  Config cfg_ = load_config(testdata("base.yaml"));
  const std::string base_ = testdata("base.yaml");
};

TEST_F(ConfigOverrideTest, ScalarReplacesInPlaceAndComesFromSet) {
  cfg_.apply_override("optimizer.lr=0.05");
  Config optimizer = cfg_.at("optimizer");
  EXPECT_DOUBLE_EQ(optimizer.get<double>("lr"), 0.05);
  EXPECT_EQ(optimizer.where("lr"), "--set (key optimizer.lr)");
  EXPECT_EQ(optimizer.at("lr").source().file, "--set");
  EXPECT_EQ(optimizer.keys(), (std::vector<std::string>{"type", "lr", "momentum"}));
  EXPECT_EQ(optimizer.where("momentum"), base_ + ":9 (key optimizer.momentum)");
  // `--set lr=fast` fails later, when read, and says where the value came from.
  cfg_.apply_override("optimizer.lr=fast");
  EXPECT_EQ(error_of([&] { cfg_.at("optimizer").get<double>("lr"); }),
            "--set (key optimizer.lr): expected a number, got 'fast'");
}

TEST_F(ConfigOverrideTest, ValueIsYaml) {
  cfg_.apply_override("model.dims=[64, 32]");
  cfg_.apply_override("work_dir='0.5'");
  cfg_.apply_override("max_epochs=");
  EXPECT_EQ(cfg_.at("model").get<std::vector<int>>("dims"), (std::vector<int>{64, 32}));
  EXPECT_EQ(cfg_.at("model").at("dims").at(1).where(), "--set (key model.dims.1)");
  EXPECT_EQ(cfg_.get<std::string>("work_dir"), "0.5");
  EXPECT_TRUE(cfg_.child("max_epochs").is_null());
  EXPECT_FALSE(cfg_.has("max_epochs"));
  // Only the first '=' splits: the rest is the value.
  cfg_.apply_override("work_dir=a=b");
  EXPECT_EQ(cfg_.get<std::string>("work_dir"), "a=b");
}

// `--set train_cfg.max_epochs=null --set train_cfg.max_iters=30` on a config
// counted in epochs: the null takes the base's key back, so the run is
// counted in iterations instead of failing with "give max_iters or
// max_epochs, not both".
TEST_F(ConfigOverrideTest, NullRemovesTheKey) {
  Config cfg = parse_config("train_cfg: {max_epochs: 3, val_interval: 1}\nlist: [1, 2]\n", "base.yaml");
  cfg.apply_override("train_cfg.max_epochs=null");
  cfg.apply_override("train_cfg.max_iters=30");
  EXPECT_EQ(cfg.at("train_cfg").keys(), (std::vector<std::string>{"val_interval", "max_iters"}));
  cfg.apply_override("train_cfg.never_there=~");  // removing an absent key is no error
  EXPECT_FALSE(cfg.at("train_cfg").has("never_there"));
  cfg.apply_override("list.1=null");  // a sequence keeps its length: the item becomes null
  EXPECT_EQ(cfg.at("list").size(), 2u);
  EXPECT_TRUE(cfg.at("list").at(1).is_null());
  EXPECT_NE(cfg.to_yaml().find("max_iters: 30"), std::string::npos);
  EXPECT_EQ(cfg.to_yaml().find("max_epochs"), std::string::npos);
}

TEST_F(ConfigOverrideTest, MapValueMergesLikeAChildConfigUnlessDeleted) {
  cfg_.apply_override("optimizer={momentum: 0.5, nesterov: true}");
  Config optimizer = cfg_.at("optimizer");
  EXPECT_EQ(optimizer.keys(), (std::vector<std::string>{"type", "lr", "momentum", "nesterov"}));
  EXPECT_DOUBLE_EQ(optimizer.get<double>("lr"), 0.1);
  EXPECT_EQ(optimizer.where("lr"), base_ + ":8 (key optimizer.lr)");
  EXPECT_DOUBLE_EQ(optimizer.get<double>("momentum"), 0.5);
  EXPECT_TRUE(optimizer.get<bool>("nesterov"));

  cfg_.apply_override("optimizer={_delete_: true, type: Adam}");
  EXPECT_EQ(cfg_.at("optimizer").keys(), std::vector<std::string>{"type"});
  EXPECT_EQ(cfg_.at("optimizer").where("type"), "--set (key optimizer.type)");
}

TEST_F(ConfigOverrideTest, MissingMapsAreCreated) {
  cfg_.apply_override("train_dataloader.sampler.seed=7");
  EXPECT_EQ(cfg_.at("train_dataloader").at("sampler").get<int>("seed"), 7);
  EXPECT_EQ(cfg_.at("train_dataloader").where(), "--set (key train_dataloader)");
  EXPECT_EQ(cfg_.keys().back(), "train_dataloader");

  Config empty;
  empty.apply_override("a.b=1");
  EXPECT_EQ(empty.at("a").get<int>("b"), 1);
  EXPECT_EQ(empty.at("a").at("b").path(), "a.b");

  Config with_null = parse_config("model:\n", "n.yaml");
  with_null.apply_override("model.depth=50");
  EXPECT_EQ(with_null.at("model").get<int>("depth"), 50);
}

TEST_F(ConfigOverrideTest, NumericPartsIndexSequences) {
  cfg_.apply_override("param_scheduler.1.T_max=100");
  Config second = cfg_.at("param_scheduler").at(1);
  EXPECT_EQ(second.get<int>("T_max"), 100);
  EXPECT_EQ(second.where("T_max"), "--set (key param_scheduler.1.T_max)");
  EXPECT_EQ(second.get<std::string>("type"), "CosineAnnealingLR");

  // A whole entry is replaced, not merged (sequences hold values, not keys).
  cfg_.apply_override("param_scheduler.0={type: ConstantLR, _delete_: true}");
  Config first = cfg_.at("param_scheduler").at(0);
  EXPECT_EQ(first.keys(), std::vector<std::string>{"type"});
  EXPECT_EQ(first.path(), "param_scheduler.0");
}

TEST_F(ConfigOverrideTest, MalformedOverridesNameTheWholeText) {
  EXPECT_EQ(error_of([&] { cfg_.apply_override("optimizer.lr"); }),
            "--set 'optimizer.lr': expected key=value, e.g. optimizer.lr=0.01");
  EXPECT_EQ(error_of([&] { cfg_.apply_override("a..b=1"); }), "--set 'a..b=1': the key 'a..b' has an empty part");
  EXPECT_EQ(error_of([&] { cfg_.apply_override("=1"); }), "--set '=1': the key '' has an empty part");
  EXPECT_EQ(error_of([&] { cfg_.apply_override("model.dims=[64, 32"); }),
            "--set 'model.dims=[64, 32': --set:1:1: end of sequence flow not found");
  EXPECT_EQ(error_of([&] { cfg_.apply_override("param_scheduler.5.end=1"); }),
            "--set 'param_scheduler.5.end=1': " + base_ +
                ":11 (key param_scheduler) has 2 entries; index 5 is out of range");
  EXPECT_EQ(error_of([&] { cfg_.apply_override("param_scheduler.99999999999=1"); }),
            "--set 'param_scheduler.99999999999=1': " + base_ +
                ":11 (key param_scheduler) has 2 entries; index 99999999999 is out of range");
  EXPECT_EQ(error_of([&] { cfg_.apply_override("param_scheduler.end=1"); }),
            "--set 'param_scheduler.end=1': " + base_ +
                ":11 (key param_scheduler) is a sequence; index it with a number, not 'end'");
  EXPECT_EQ(error_of([&] { cfg_.apply_override("max_epochs.x=1"); }),
            "--set 'max_epochs.x=1': " + base_ + ":10 (key max_epochs) is '10', not a map");
  EXPECT_EQ(error_of([&] { cfg_.apply_override("model={_delete_: maybe}"); }),
            "--set (key model._delete_): _delete_ must be true or false, got 'maybe'");
  EXPECT_EQ(error_of([&] { cfg_.apply_override("new.map={_delete_: maybe}"); }),
            "--set (key new.map._delete_): _delete_ must be true or false, got 'maybe'");
  // Nothing half-applied by the failures above.
  EXPECT_EQ(cfg_.to_yaml(), load_config(base_).to_yaml());
}

}  // namespace
}  // namespace lockstep
