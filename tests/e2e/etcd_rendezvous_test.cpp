// `lockstep run --rdzv-backend etcd` on one machine, against a real etcd:
// the same job as with the c10d rendezvous, bitwise, also beside another job
// on the same etcd; a run id used before starts afresh; another job token is
// refused; an etcd nobody can reach is
// an error that names every endpoint. Losing nodes (the first one included)
// is tests/multinode's `etcd` scenario, on three namespace hosts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <future>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "tests/support/etcd_server.h"
#include "tests/support/small_job.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using testing::EtcdServer;
using testing::run_command;

class EtcdRendezvousRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<testing::TempDir>();
    config_ = testing::write_small_job(*dir_);
  }

  // `lockstep run` of one node of an elastic job of two, training the small job into `work`.
  std::vector<std::string> node(const std::vector<std::string>& rendezvous, const std::string& work) const {
    std::vector<std::string> argv{testing::lockstep_binary(), "run", "--nnodes", "2:2", "--nproc-per-node", "1",
                                  "--rdzv-conf", "last_call_timeout=1"};
    argv.insert(argv.end(), rendezvous.begin(), rendezvous.end());
    argv.push_back("--");
    for (const std::string& arg : testing::train_argv(config_, work, {testing::ddp_strategy_line()})) argv.push_back(arg);
    return argv;
  }
  // Jobs of two nodes each, all nodes at once: (rendezvous, work dir, environment) per job.
  struct Job {
    std::vector<std::string> rendezvous;
    std::string work;
    std::vector<std::string> env;
  };
  std::vector<testing::CommandResult> run_jobs(const std::vector<Job>& jobs) const {
    std::vector<std::future<testing::CommandResult>> nodes;
    for (const Job& job : jobs) {
      for (int n = 0; n < 2; ++n) {
        nodes.push_back(std::async(std::launch::async, [&] { return run_command(node(job.rendezvous, job.work), job.env, 180); }));
      }
    }
    std::vector<testing::CommandResult> results;
    for (auto& n : nodes) results.push_back(n.get());
    return results;
  }
  void expect_weights_equal(const std::string& work, const std::string& reference) const {
    EXPECT_TRUE(testing::bitwise_equal(testing::checkpoint_weights(work + "/model_final.ckpt"),
                                       testing::checkpoint_weights(reference + "/model_final.ckpt")))
        << work;
  }
  std::unique_ptr<testing::TempDir> dir_;
  std::string config_;
};

TEST_F(EtcdRendezvousRun, TrainsBitwiseLikeTheC10dRendezvousBesideAnotherJobAndAgainUnderTheSameId) {
  if (auto why = EtcdServer::missing(); !why.empty()) GTEST_SKIP() << why;
  EtcdServer etcd;
  const std::vector<std::string> env{"LOCKSTEP_JOB_TOKEN=etcd-run-test", "LOCKSTEP_TIMEOUT_S=60"};
  const std::string port = std::to_string(EtcdServer::free_port());
  for (const auto& result : run_jobs({{{"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:" + port},
                                       dir_->file("c10d"), env}})) {
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  auto on_etcd = [&](const std::string& id) {
    return std::vector<std::string>{"--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoint(), "--rdzv-id", id};
  };
  // job1, then job1 again beside another job (its own id and token) on the same etcd.
  const std::vector<std::vector<Job>> waves{
      {{on_etcd("job1"), dir_->file("etcd"), env}},
      {{on_etcd("job1"), dir_->file("again"), env},
       {on_etcd("neighbour"), dir_->file("neighbour"), {"LOCKSTEP_JOB_TOKEN=another-job", "LOCKSTEP_TIMEOUT_S=60"}}}};
  for (const auto& wave : waves) {
    const auto results = run_jobs(wave);
    for (size_t j = 0; j < wave.size(); ++j) {
      int node0 = 0;
      for (size_t n = 2 * j; n < 2 * j + 2; ++n) {
        const auto& output = results[n].output;
        ASSERT_EQ(results[n].exit_code, 0) << output;
        EXPECT_NE(output.find("joining etcd at http://" + etcd.endpoint()), std::string::npos) << output;
        EXPECT_EQ(output.find("rendezvous round 1"), std::string::npos) << output;
        node0 += output.find("rendezvous round 0: node 0 of 2") != std::string::npos;
      }
      EXPECT_EQ(node0, 1) << wave[j].work;
      expect_weights_equal(wave[j].work, dir_->file("c10d"));
    }
  }
}

TEST_F(EtcdRendezvousRun, AnotherJobTokenIsRefused) {
  if (auto why = EtcdServer::missing(); !why.empty()) GTEST_SKIP() << why;
  EtcdServer etcd;
  std::vector<std::string> first = node({"--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoint(), "--rdzv-id",
                                         "job2", "--join-timeout", "2"}, dir_->file("w"));
  // The first node records the job's token and waits (in vain) for a second node.
  auto waiting = run_command(first, {"LOCKSTEP_JOB_TOKEN=the-token"}, 60);
  EXPECT_NE(waiting.exit_code, 0);
  EXPECT_NE(waiting.output.find("no rendezvous round admitted this node (2 to 2 nodes; round 0) within 2 s"),
            std::string::npos) << waiting.output;
  auto stranger = run_command(first, {"LOCKSTEP_JOB_TOKEN=another-token"}, 60);
  EXPECT_NE(stranger.exit_code, 0);
  EXPECT_NE(stranger.output.find("refused by job 'job2' on etcd at http://" + etcd.endpoint() + ": wrong job token"),
            std::string::npos) << stranger.output;
}

TEST_F(EtcdRendezvousRun, UnreachableEtcdIsAnErrorNamingEveryEndpoint) {
  const std::string a = "127.0.0.1:" + std::to_string(EtcdServer::free_port());
  const std::string b = "127.0.0.1:" + std::to_string(EtcdServer::free_port());
  auto result = run_command(node({"--rdzv-backend", "etcd", "--rdzv-endpoint", a + "," + b, "--rdzv-id", "job3"},
                                 dir_->file("w")),
                            {"LOCKSTEP_JOB_TOKEN=t"}, 60);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_LT(result.seconds, 30);
  EXPECT_NE(result.output.find("cannot reach etcd at any of its endpoints: http://" + a), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("http://" + b + " ("), std::string::npos) << result.output;
  // Settings etcd needs are asked for by name.
  result = run_command(node({"--rdzv-backend", "etcd", "--rdzv-endpoint", a}, dir_->file("w")), {"LOCKSTEP_JOB_TOKEN=t"});
  EXPECT_NE(result.output.find("--rdzv-backend etcd needs --rdzv-id"), std::string::npos) << result.output;
  result = run_command(node({"--rdzv-backend", "etcd", "--rdzv-endpoint", a, "--rdzv-id", "j"}, dir_->file("w")),
                       {"LOCKSTEP_JOB_TOKEN="});
  EXPECT_NE(result.output.find("--rdzv-backend etcd needs a job token"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace lockstep
