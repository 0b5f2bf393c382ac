#include "lockstep/core/spelling.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(Spelling, EditDistanceCountsInsertionsDeletionsSubstitutions) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("Train_CFG", "train_cfg"), 0u);
  EXPECT_EQ(edit_distance("modle", "model"), 1u);  // one swap of neighbours
}

TEST(Spelling, SuggestsTheNearestKeyOnlyWhenItIsClose) {
  const std::vector<std::string> keys{"train_cfg", "train_dataloader", "val_cfg", "model", "optim_wrapper"};
  EXPECT_EQ(closest_name("trian_cfg", keys), "train_cfg");
  EXPECT_EQ(closest_name("train", keys), "train_cfg");  // a prefix: the shortest candidate that extends it
  EXPECT_EQ(did_you_mean("train", {"train_dataloader", "train_cfg", "trainer", "model"}),
            " (did you mean 'trainer', 'train_cfg' or 'train_dataloader'?)");
  EXPECT_EQ(closest_name("modle", keys), "model");
  EXPECT_EQ(closest_name("optimizer", keys), "");
  EXPECT_EQ(closest_name("foo", keys), "");
  EXPECT_EQ(did_you_mean("modl", keys), " (did you mean 'model'?)");
  EXPECT_EQ(did_you_mean("foo", keys), "");
  EXPECT_EQ(closest_name("x", {}), "");
}

}  // namespace
}  // namespace lockstep
