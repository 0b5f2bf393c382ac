#include "lockstep/core/internal/internal_error.h"

#include <gtest/gtest.h>

#include <string>

namespace lockstep {
namespace {

enum class Door { kClosed, kOpening, kOpen };
constexpr unsigned kMayComeFrom[] = {kFromAny, phase_bit(Door::kClosed), phase_bit(Door::kOpening)};
constexpr const char* kNames[] = {"closed", "opening", "open"};

TEST(MovePhase, TakesTheEdgesOfItsTableAndNoOther) {
  Door door = Door::kClosed;
  move_phase("the door", door, Door::kOpening, kMayComeFrom, kNames);
  EXPECT_EQ(door, Door::kOpening);
  move_phase("the door", door, Door::kOpen, kMayComeFrom, kNames);
  EXPECT_EQ(door, Door::kOpen);
  try {
    move_phase("the door", door, Door::kOpening, kMayComeFrom, kNames);
    FAIL() << "open -> opening is not an edge";
  } catch (const InternalError& error) {
    EXPECT_NE(std::string(error.what()).find("a bug in lockstep"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("the door has no move from open to opening"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(door, Door::kOpen);  // a refused move changes nothing
  move_phase("the door", door, Door::kClosed, kMayComeFrom, kNames);  // from anywhere
  EXPECT_EQ(door, Door::kClosed);
  EXPECT_THROW(move_phase("the door", door, Door::kOpen, kMayComeFrom, kNames), InternalError);
}

}  // namespace
}  // namespace lockstep
