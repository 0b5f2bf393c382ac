#include "lockstep/core/open_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "tests/support/test_support.h"

namespace lockstep {
namespace {

TEST(OpenFiles, EnoughRoomChangesNothing) {
  const OpenFilesRoom room = plan_open_files_room(10, 100, 1024, 524288, "rank 3", "joining a job of 101 ranks");
  EXPECT_EQ(room.needed, 10 + 100 + kOpenFilesMargin);
  EXPECT_FALSE(room.raised());
  EXPECT_EQ(room.soft_after, 1024u);
  EXPECT_FALSE(plan_open_files_room(10, 100, RLIM_INFINITY, RLIM_INFINITY, "rank 3", "x").raised());
  // Exactly enough is enough.
  EXPECT_FALSE(plan_open_files_room(10, 100, 10 + 100 + kOpenFilesMargin, 200, "rank 3", "x").raised());
}

TEST(OpenFiles, TooLittleRoomRaisesTheSoftLimitToTheHardOne) {
  const OpenFilesRoom room = plan_open_files_room(12, 999, 1024, 524288, "rank 3", "joining a job of 1000 ranks");
  EXPECT_TRUE(room.raised());
  EXPECT_EQ(room.soft_before, 1024u);
  EXPECT_EQ(room.soft_after, 524288u);
  EXPECT_EQ(room.describe(), "raised the open-file limit (RLIMIT_NOFILE) from 1024 to 524288: joining a job of 1000 "
                             "ranks needs about " + std::to_string(12 + 999 + kOpenFilesMargin));
  // An unlimited hard limit cannot be a soft one: the count itself then.
  EXPECT_EQ(plan_open_files_room(12, 999, 1024, RLIM_INFINITY, "rank 3", "x").soft_after,
            static_cast<rlim_t>(12 + 999 + kOpenFilesMargin));
  // A negative count asks for nothing more than the margin.
  EXPECT_EQ(plan_open_files_room(12, -5, 1024, 2048, "rank 3", "x").needed, 12 + kOpenFilesMargin);
}

TEST(OpenFiles, TooSmallAHardLimitIsAnErrorWithTheNumbers) {
  const std::string message = testing::error_of(
      [] { plan_open_files_room(12, 999, 1024, 1024, "rank 3", "joining a job of 1000 ranks"); });
  const std::string needed = std::to_string(12 + 999 + kOpenFilesMargin);
  for (const std::string& part :
       {std::string("rank 3: joining a job of 1000 ranks needs about ") + needed + " open files (12 open now)",
        std::string("may open at most 1024 (the hard limit of RLIMIT_NOFILE, `ulimit -Hn`)"),
        std::string("/etc/security/limits.conf"), std::string("LimitNOFILE=")}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << "\n" << message;
  }
  // A caller that adds its own context leaves `who` empty.
  const std::string bare = testing::error_of([] { plan_open_files_room(12, 999, 100, 100, "", "a Gloo mesh of 1000 ranks"); });
  EXPECT_EQ(bare.rfind("a Gloo mesh of 1000 ranks needs about", 0), 0u) << bare;
}

TEST(OpenFiles, CountsThisProcesssDescriptors) {
  const long before = open_file_count();
  EXPECT_GE(before, 3);  // stdin, stdout, stderr at least
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(open_file_count(), before + 1);
  ::close(fd);
  EXPECT_EQ(open_file_count(), before);
}

// The real limit of this process: lowered to just what is open, then made
// room for; put back afterwards (lowering a soft limit is always allowed).
TEST(OpenFiles, RaisesThisProcesssLimitAndRemembersTheOneItStartedWith) {
  rlimit original{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &original), 0);
  if (original.rlim_max != RLIM_INFINITY && original.rlim_max < 512) GTEST_SKIP() << "hard limit " << original.rlim_max;
  rlimit low = original;
  low.rlim_cur = static_cast<rlim_t>(open_file_count() + 8);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  ASSERT_FALSE(open_file_limit_at_start().has_value());

  const OpenFilesRoom room = make_room_for_open_files(300, "test", "three hundred sockets");
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  const bool has_start = open_file_limit_at_start().has_value();
  const rlim_t start = has_start ? open_file_limit_at_start()->rlim_cur : 0;
  // Asking again for what fits changes nothing.
  const bool raised_again = make_room_for_open_files(300, "test", "three hundred sockets").raised();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &original), 0);

  EXPECT_TRUE(room.raised());
  EXPECT_EQ(room.soft_before, low.rlim_cur);
  EXPECT_EQ(now.rlim_cur, original.rlim_max == RLIM_INFINITY ? static_cast<rlim_t>(room.needed) : original.rlim_max);
  EXPECT_EQ(now.rlim_max, original.rlim_max);  // never touched
  EXPECT_TRUE(has_start);
  EXPECT_EQ(start, low.rlim_cur);
  EXPECT_FALSE(raised_again);
}

}  // namespace
}  // namespace lockstep
