#include "lockstep/core/ordered_worker.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lockstep/core/error.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using testing::error_of;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A task that holds the worker until the test lets it go, and says when it has started.
struct Gate {
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  std::function<void()> task() {
    return [this] {
      started.set_value();
      released.wait();
    };
  }
  // Submits task() and returns once `worker` runs it: the worker is busy until release.
  void hold(OrderedWorker& worker) {
    worker.submit(task());
    started.get_future().wait();
  }
};

TEST(OrderedWorker, RunsTasksOneAtATimeInOrder) {
  std::vector<int> order;
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};
  OrderedWorker worker("test worker", /*capacity=*/4, /*wait_limit_s=*/5);
  for (int i = 0; i < 50; ++i) {
    worker.submit([&, i] {
      if (++running > 1) overlapped = true;
      order.push_back(i);
      --running;
    });
  }
  worker.drain();
  EXPECT_FALSE(overlapped.load());
  std::vector<int> expected(50);
  for (int i = 0; i < 50; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
  EXPECT_EQ(worker.queued(), 0);
}

TEST(OrderedWorker, KeepsTheFirstErrorAndRunsTheRest) {
  OrderedWorker worker("test worker", 8, 5);
  int ran = 0;
  worker.submit([&] { ++ran; });
  worker.submit([&] {
    ++ran;
    throw Error("first failure");
  });
  worker.submit([&] {
    ++ran;
    throw Error("second failure");
  });
  worker.submit([&] { ++ran; });
  worker.drain();  // does not throw a task's error
  EXPECT_EQ(ran, 4);
  EXPECT_EQ(error_of([&] { worker.rethrow_error(); }), "first failure");
  EXPECT_NO_THROW(worker.rethrow_error());  // reported once
}

TEST(OrderedWorker, SubmitWaitsForRoomWhenTheQueueIsFull) {
  Gate gate;
  OrderedWorker worker("test worker", /*capacity=*/1, /*wait_limit_s=*/5);
  std::atomic<int> ran{0};
  gate.hold(worker);
  worker.submit([&] { ++ran; });  // fills the queue
  const auto start = std::chrono::steady_clock::now();
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gate.release.set_value();
  });
  worker.submit([&] { ++ran; });  // waits until the gate's task ends and frees the slot
  const double waited = seconds_since(start);
  opener.join();
  EXPECT_GE(waited, 0.09);
  EXPECT_LT(waited, 4);
  worker.drain();
  EXPECT_EQ(ran.load(), 2);
}

TEST(OrderedWorker, SubmitAndDrainThrowAfterTheWaitLimitNamingTheWorker) {
  Gate gate;
  OrderedWorker worker("metrics writer", /*capacity=*/2, /*wait_limit_s=*/0.2);
  std::atomic<int> ran{0};
  gate.hold(worker);
  worker.submit([&] { ++ran; });
  worker.submit([&] { ++ran; });
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { worker.submit([&] { ++ran; }); });
  const double waited = seconds_since(start);
  EXPECT_GE(waited, 0.19);
  EXPECT_LT(waited, 4);
  EXPECT_THAT(message, HasSubstr("metrics writer: waited 0.2 s to queue a task: 2 tasks are queued and the running "
                                 "one has been running for "));
  EXPECT_EQ(worker.queued(), 2);  // the refused task was not queued

  EXPECT_THAT(error_of([&] { worker.drain(); }),
              HasSubstr("metrics writer: waited 0.2 s for its tasks to finish: 2 tasks are queued"));

  gate.release.set_value();
  worker.drain();
  EXPECT_EQ(ran.load(), 2);
}

TEST(OrderedWorker, DestructorDropsTasksThatHaveNotStartedAndJoinsTheRunningOne) {
  Gate gate;
  std::atomic<int> ran{0};
  std::atomic<bool> gate_task_done{false};
  auto worker = std::make_unique<OrderedWorker>("test worker", 8, 5);
  worker->submit([&] {
    gate.task()();
    gate_task_done = true;
  });
  gate.started.get_future().wait();
  for (int i = 0; i < 5; ++i) worker->submit([&] { ++ran; });
  OrderedWorker* raw = worker.get();
  // Lets the running task finish once the destructor has emptied the queue
  // (the destructor joins that task, so raw stays valid until then).
  std::thread opener([&] {
    while (raw->queued() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    gate.release.set_value();
  });
  const auto start = std::chrono::steady_clock::now();
  worker.reset();
  opener.join();
  EXPECT_LT(seconds_since(start), 4);
  EXPECT_TRUE(gate_task_done.load()) << "the running task was not joined";
  EXPECT_EQ(ran.load(), 0) << "the destructor ran tasks that had not started";
}

TEST(OrderedWorker, BadOptions) {
  EXPECT_THAT(error_of([] { OrderedWorker("w", 0, 1); }), HasSubstr("w: the queue's capacity must be at least 1"));
  EXPECT_THAT(error_of([] { OrderedWorker("w", 1, -1); }), HasSubstr("w: the wait limit must be >= 0"));
}

}  // namespace
}  // namespace lockstep
