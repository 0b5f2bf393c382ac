// Unit tests of the launcher-environment readers and the SLURM parsers (no
// processes, no network). They live in tests/comm because lockstep/comm's own
// *_test.cpp binary would share the name test_dist with this folder's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/comm/env.h"
#include "lockstep/comm/mpi_meeting.h"

namespace lockstep {
namespace {

using testing::error_of;

using Hosts = std::vector<std::string>;

// Where an environment places this process, in one line to compare:
// "<launcher> rank R/W local L/LW node N at ADDR:PORT".
std::string placement(const DistEnv& env) {
  return env.launcher + " rank " + std::to_string(env.rank) + "/" + std::to_string(env.world_size) + " local " +
         std::to_string(env.local_rank) + "/" + std::to_string(env.local_world_size) + " node " +
         std::to_string(env.node_rank) + " at " + env.master_addr + ":" + std::to_string(env.master_port);
}

TEST(SlurmNodelist, ExpandsRangesListsAndPlainHosts) {
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,07],gpu5"), (Hosts{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu5"), (Hosts{"gpu5"}));
  EXPECT_EQ(expand_slurm_nodelist("a,b,c"), (Hosts{"a", "b", "c"}));
  EXPECT_EQ(expand_slurm_nodelist("n[7]"), (Hosts{"n7"}));
}

TEST(SlurmNodelist, PaddingFollowsTheFirstBound) {
  EXPECT_EQ(expand_slurm_nodelist("n[8-11]"), (Hosts{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_slurm_nodelist("n[008-010]"), (Hosts{"n008", "n009", "n010"}));
  EXPECT_EQ(expand_slurm_nodelist("n[09-10]"), (Hosts{"n09", "n10"}));
}

TEST(SlurmNodelist, SeveralBracketGroupsExpandAsAProduct) {
  EXPECT_EQ(expand_slurm_nodelist("rack[1-2]-node[01-02]"),
            (Hosts{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1,3]n[5-6].ib,login"),
            (Hosts{"r1n5.ib", "r1n6.ib", "r3n5.ib", "r3n6.ib", "login"}));
}

TEST(SlurmNodelist, RejectsMalformedLists) {
  EXPECT_NE(error_of([] { expand_slurm_nodelist("node[01-03"); }).find("unclosed"), std::string::npos);
  EXPECT_NE(error_of([] { expand_slurm_nodelist("node01-03]"); }).find("node01-03]"), std::string::npos);
  EXPECT_NE(error_of([] { expand_slurm_nodelist("node[03-01]"); }).find("backwards"), std::string::npos);
  EXPECT_NE(error_of([] { expand_slurm_nodelist("node[a-b]"); }).find("'a-b'"), std::string::npos);
  EXPECT_NE(error_of([] { expand_slurm_nodelist("n[[1]]"); }).find("nested"), std::string::npos);
  EXPECT_NE(error_of([] { expand_slurm_nodelist(""); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([] { expand_slurm_nodelist("a,,b"); }).find("empty host"), std::string::npos);
}

TEST(SlurmTasksPerNode, ExpandsRepeats) {
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_NE(error_of([] { expand_slurm_tasks_per_node("2(x"); }).find("N(xM)"), std::string::npos);
}

// One variable changed from a good environment, and the error that must follow.
constexpr const char* kUnset = nullptr;
struct BadVariable {
  const char* name;
  const char* value;  // kUnset: removed
  const char* error;  // a part of the message
};

// For each change to `good`, alone, detect_dist_env(launcher) fails naming it.
void expect_errors(const std::string& launcher, const Environment& good, const std::vector<BadVariable>& changes) {
  for (const BadVariable& change : changes) {
    Environment vars = good;
    if (change.value == kUnset) {
      vars.erase(change.name);
    } else {
      vars[change.name] = change.value;
    }
    const std::string message = error_of([&] { detect_dist_env(launcher, vars); });
    EXPECT_NE(message.find(change.error), std::string::npos)
        << change.name << "=" << (change.value ? change.value : "<unset>") << ": " << message;
  }
}

Environment torchrun_env() {
  return {{"RANK", "3"},           {"WORLD_SIZE", "4"},         {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},       {"MASTER_ADDR", "10.1.2.3"},
          {"MASTER_PORT", "29400"}, {"TORCHELASTIC_RUN_ID", "x"}};
}

TEST(DetectDistEnv, ReadsTorchrunVariables) {
  auto env = detect_dist_env("pytorch", torchrun_env());
  EXPECT_EQ(placement(env), "pytorch rank 3/4 local 1/2 node 1 at 10.1.2.3:29400");
  EXPECT_FALSE(env.use_agent_store);
  EXPECT_EQ(env.restart_count, 0);
}

TEST(DetectDistEnv, AgentStoreNeedsTheRestartCount) {
  auto vars = torchrun_env();
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  EXPECT_NE(error_of([&] { detect_dist_env("pytorch", vars); }).find("TORCHELASTIC_RESTART_COUNT is not set"),
            std::string::npos);
  vars["TORCHELASTIC_RESTART_COUNT"] = "2";
  auto env = detect_dist_env("pytorch", vars);
  EXPECT_TRUE(env.use_agent_store);
  EXPECT_EQ(env.restart_count, 2);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(detect_dist_env("pytorch", vars).use_agent_store);
}

TEST(DetectDistEnv, TorchrunErrorsNameTheVariable) {
  expect_errors("pytorch", torchrun_env(),
                {{"RANK", kUnset, "environment variable RANK is not set"},
                 {"WORLD_SIZE", "four", "WORLD_SIZE='four' is not an integer"},
                 {"RANK", "4", "rank 4 is not in [0, 4)"},
                 {"MASTER_PORT", "70000", "MASTER_PORT=70000"},
                 {"MASTER_ADDR", kUnset, "MASTER_ADDR"},
                 {"LOCAL_RANK", "2", "local rank 2"}});
}

Environment slurm_env() {
  return {{"SLURM_PROCID", "5"},  {"SLURM_NTASKS", "7"},
          {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
          {"SLURM_TASKS_PER_NODE", "2(x2),3"}, {"SLURM_NODELIST", "gpu[07-09],cpu1"}};
}

TEST(DetectDistEnv, ReadsSlurmVariablesAndTheFirstHost) {
  auto env = detect_dist_env("slurm", slurm_env());
  // 3 ranks on node 2 of "2(x2),3"; the default port, as there is no SLURM_JOB_ID.
  EXPECT_EQ(placement(env), "slurm rank 5/7 local 1/3 node 2 at gpu07:29500");
}

TEST(DetectDistEnv, SlurmJobsGetAPortOfTheirOwn) {
  auto vars = slurm_env();
  vars["SLURM_JOB_ID"] = "4312345";
  EXPECT_EQ(detect_dist_env("slurm", vars).master_port, 15000 + 2345);  // PyTorch Lightning's rule
  vars["SLURM_JOB_ID"] = "17";
  EXPECT_EQ(detect_dist_env("slurm", vars).master_port, 15017);
  vars["MASTER_PORT"] = "1234";
  EXPECT_EQ(detect_dist_env("slurm", vars).master_port, 1234);
}

TEST(DetectDistEnv, SlurmPrefersExplicitMasterAndTasksPerNode) {
  auto vars = slurm_env();
  vars["MASTER_ADDR"] = "head";
  vars["MASTER_PORT"] = "1234";
  vars["SLURM_NTASKS_PER_NODE"] = "4";
  auto env = detect_dist_env("slurm", vars);
  EXPECT_EQ(env.master_addr, "head");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_EQ(env.local_world_size, 4);
}

TEST(DetectDistEnv, SlurmErrors) {
  expect_errors("slurm", slurm_env(),
                {{"SLURM_LOCALID", kUnset, "SLURM_LOCALID is not set"},
                 {"SLURM_NODELIST", kUnset, "SLURM_NODELIST"},
                 {"SLURM_NODELIST", "gpu[07-", "SLURM_NODELIST: nodelist 'gpu[07-'"},
                 {"SLURM_NODEID", "3", "lists 3 nodes"}});
}

TEST(DetectDistEnv, ReadsOpenMpiVariables) {
  Environment vars{{"OMPI_COMM_WORLD_RANK", "2"},       {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"MASTER_ADDR", "host0"}};
  auto env = detect_dist_env("mpi", vars);
  EXPECT_EQ(placement(env), "mpi rank 2/4 local 0/2 node -1 at host0:29500");
  vars.erase("MASTER_ADDR");
  // Without MASTER_ADDR the ranks meet over MPI_COMM_WORLD when lockstep has
  // MPI (comm/mpi_meeting.h), and the error says how to go on when it has not.
  if (can_meet_over_mpi()) {
    EXPECT_TRUE(detect_dist_env("mpi", vars).meet_over_mpi);
  } else {
    EXPECT_NE(error_of([&] { detect_dist_env("mpi", vars); }).find("MASTER_ADDR is not set"), std::string::npos);
  }
  vars["MASTER_ADDR"] = "host0";
  EXPECT_FALSE(detect_dist_env("mpi", vars).meet_over_mpi);
}

TEST(DetectDistEnv, AutoPicksTheLauncherThatApplies) {
  EXPECT_EQ(detect_dist_env("auto", torchrun_env()).launcher, "pytorch");
  EXPECT_EQ(detect_dist_env("auto", slurm_env()).launcher, "slurm");
  Environment mpi{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                  {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}};
  EXPECT_EQ(detect_dist_env("auto", mpi).launcher, "mpi");  // mpirun inside an allocation
  auto none = detect_dist_env("auto", Environment{});
  EXPECT_EQ(none.launcher, "none");
  EXPECT_EQ(none.rank, 0);
  EXPECT_EQ(none.world_size, 1);
  EXPECT_NE(error_of([] { detect_dist_env("pbs", Environment{}); }).find("unknown launcher 'pbs'"),
            std::string::npos);
}

// A launcher named in the config that left nothing behind: a process started
// by hand, which runs as a world of one. Some of its variables but not all is
// still an error naming the missing one.
TEST(DetectDistEnv, ANamedLauncherThatLeftNothingIsAWorldOfOne) {
  for (const char* launcher : {"pytorch", "slurm", "mpi"}) {
    DistEnv env = detect_dist_env(launcher, Environment{{"HOME", "/root"}});
    EXPECT_EQ(env.launcher, "none") << launcher;
    EXPECT_EQ(env.world_size, 1) << launcher;
    EXPECT_EQ(env.rank, 0) << launcher;
    EXPECT_EQ(env.absent_launcher, launcher);
  }
  EXPECT_NE(error_of([] { detect_dist_env("pytorch", Environment{{"RANK", "0"}, {"WORLD_SIZE", "2"}}); })
                .find("LOCAL_RANK is not set"),
            std::string::npos);
}

TEST(LaunchedWorldSize, ReadsWhatEachLauncherSets) {
  EXPECT_EQ(launched_world_size(Environment{}), 1);
  EXPECT_EQ(launched_world_size(Environment{{"WORLD_SIZE", "4"}, {"RANK", "1"}}), 4);
  EXPECT_EQ(launched_world_size(Environment{{"OMPI_COMM_WORLD_SIZE", "2"}}), 2);
  EXPECT_EQ(launched_world_size(Environment{{"SLURM_STEP_NUM_TASKS", "8"}}), 8);
  EXPECT_EQ(launched_world_size(Environment{{"WORLD_SIZE", "1"}}), 1);
  EXPECT_EQ(launched_world_size(Environment{{"WORLD_SIZE", "two"}}), 1);
  // An sbatch script (no srun step) runs one process whatever SLURM_NTASKS says.
  EXPECT_EQ(launched_world_size(Environment{{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}}), 1);
}

}  // namespace
}  // namespace lockstep
