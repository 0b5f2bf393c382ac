// FSDP ranks that fall out of step fail, every one of them, with a message
// that says so, instead of summing gradients of different steps or units
// (parallel/fsdp/step_check.h). Each worker test runs on 2 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "tests/fsdp/fsdp_test_util.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

// Two units of the same size (8x8 + 8), run through unit_scope in an order
// the test chooses per rank: with the order swapped on one rank, every
// gather pairs unit a with unit b and nothing fails by itself.
struct TwinUnits : Model {
  struct BlockImpl : torch::nn::Module {
    BlockImpl() { fc = register_module("fc", torch::nn::Linear(8, 8)); }
    torch::Tensor forward(torch::Tensor x) {
      auto scope = fsdp::unit_scope(*this);
      return scope.output(torch::tanh(fc(x)));
    }
    torch::nn::Linear fc{nullptr};
  };
  TORCH_MODULE(Block);

  TwinUnits() {
    a = register_module("a", Block());
    b = register_module("b", Block());
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  LossDict loss(const Batch& data) override {
    torch::Tensor x = data.at("x");
    const std::string entering_b = "entering_b/" + std::to_string(step) + "/";
    if (swapped) {
      x = a(b(x));
    } else {
      x = a(x);
      if (!skip_b) {
        world()->store()->set(entering_b + std::to_string(get_rank()), std::vector<uint8_t>{1});
        x = b(x);
      }
    }
    if (skip_b) {
      // A rank that skips b reaches the step check half a second after the
      // others said they enter b's gather, so that they always time out
      // first, however late a loaded machine lets them get there.
      std::vector<std::string> others;
      for (int rank = 0; rank < get_world_size(); ++rank) {
        if (rank != get_rank()) others.push_back(entering_b + std::to_string(rank));
      }
      world()->store()->wait(others);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    LossDict losses;
    losses.insert("loss", torch::nn::functional::cross_entropy(head(x), data.at("y")));
    return losses;
  }
  Batch predict(const Batch& data) override { return {{"logits", head(b(a(data.at("x"))))}}; }
  Block a{nullptr}, b{nullptr};
  torch::nn::Linear head{nullptr};
  bool swapped = false;
  bool skip_b = false;
  int64_t step = 0;
};

Batch batch_for(int64_t step) {
  torch::manual_seed(static_cast<uint64_t>(step));
  return Batch{{"x", torch::randn({4, 8})}, {"y", torch::randint(0, 3, {4}, torch::kLong)}};
}

// Each rank marks in the job's store that it has its error and waits, polling
// and bounded, until every rank has: rank 0 hosts the store, and rank 1 reads
// there which ranks arrived at its collective.
void hold_until_every_rank_has_its_error() {
  const auto& store = world()->store();
  store->set("has_error/" + std::to_string(get_rank()), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int rank = 0; rank < get_world_size(); ++rank) keys.push_back("has_error/" + std::to_string(rank));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!store->check(keys)) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "a peer never reached its error";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Trains 5 steps; `deviate(step, model)` may change what this rank does.
// Returns the error every rank must end with.
template <typename Deviation>
std::string train_until_error(Deviation deviate) {
  torch::manual_seed(1);
  auto model = std::make_shared<TwinUnits>();
  auto fsdp = std::make_shared<FullyShardedDataParallel>(
      model, world(), FSDPOptions().auto_wrap_policy(module_type_wrap_policy({"Block"})));
  auto optim = testing::adam(fsdp->shard_parameters());
  optim->set_gradient_sync(fsdp);
  optim->initialize_count_status(0, 5);
  try {
    for (int64_t step = 0; step < 5; ++step) {
      model->swapped = model->skip_b = false;
      model->step = step;
      if (!deviate(step, *model)) continue;
      model->run_train_step(batch_for(step), *optim, {step, {}});  // as the Trainer does
    }
  } catch (const Error& error) {
    return error.what();
  }
  return "<no error>";
}

LOCKSTEP_WORKER_TEST(FsdpStepWorker, SkippedStepFailsOnEveryRank) {
  testing::WorkerWorld world_guard;
  const std::string message = train_until_error([](int64_t step, TwinUnits&) {
    return !(get_rank() == 1 && step == 2);  // rank 1 skips step 2
  });
  EXPECT_NE(message.find("FSDP ranks are out of step"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 at iteration 2"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 at iteration 3"), std::string::npos) << message;
}

LOCKSTEP_WORKER_TEST(FsdpStepWorker, UnitsInAnotherOrderFailOnEveryRank) {
  testing::WorkerWorld world_guard;
  const std::string message = train_until_error([](int64_t step, TwinUnits& model) {
    model.swapped = get_rank() == 1 && step == 1;  // equal sizes: the gathers pair a with b silently
    return true;
  });
  EXPECT_NE(message.find("FSDP ranks are out of step"), std::string::npos) << message;
  EXPECT_NE(message.find("same units in the same order"), std::string::npos) << message;
}

// A rank that skips a unit leaves the others waiting in a collective it never
// joins, while it waits at the step check: each ends with a message saying
// what happened, and no collective of another size is ever paired with theirs
// (Gloo would abort the process on that). Rank 0 times out in b's gather;
// rank 1, half a second behind it, either times out at the step check too or
// sees rank 0 close its connections first (Note [A lost peer that never
// arrived], comm/work.cpp): both say that rank 0 never arrived.
LOCKSTEP_WORKER_TEST(FsdpStepWorker, SkippedUnitEndsEveryRankWithoutAHang) {
  testing::WorkerWorld world_guard;
  const std::string message = train_until_error([](int64_t step, TwinUnits& model) {
    model.skip_b = get_rank() == 1 && step == 1;
    return true;
  });
  std::cerr << "rank " << get_rank() << " error: " << message << std::endl;
  hold_until_every_rank_has_its_error();
  EXPECT_NE(message.find("ran different units"), std::string::npos) << message;
  if (get_rank() == 0) {
    EXPECT_NE(message.find("timed out"), std::string::npos) << message;
    EXPECT_NE(message.find("FSDP unit 'b': gathering its parameters"), std::string::npos) << message;
    EXPECT_NE(message.find("waiting for ranks [1]"), std::string::npos) << message;
  } else {
    const bool timed_out = message.find("timed out") != std::string::npos;
    const bool lost = message.find("which never entered it and closed their connections") != std::string::npos;
    EXPECT_TRUE(timed_out || lost) << message;
    EXPECT_NE(message.find("FSDP ranks are out of step"), std::string::npos) << message;
    EXPECT_NE(message.find("waiting for ranks [0]"), std::string::npos) << message;
  }
}

TEST(FsdpStepCheck, RanksOutOfStepFailWithoutHanging) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::WorkersOptions options;
  options.env = {"LOCKSTEP_TIMEOUT_S=15"};
  options.timeout_s = 120;
  testing::expect_each_worker_ok(2, {"FsdpStepWorker.SkippedStepFailsOnEveryRank",
                                     "FsdpStepWorker.UnitsInAnotherOrderFailOnEveryRank",
                                     "FsdpStepWorker.SkippedUnitEndsEveryRankWithoutAHang"},
                                 options);
}

}  // namespace
}  // namespace lockstep
