// OrderedWorker: one background thread that runs tasks in submission order,
// with a bounded queue and bounded waits.
//
// The trainer writes its metrics on one (each write is a gather across ranks,
// kept off the step's path). Tasks run one at a time, in the order submitted;
// the first exception a task raises is kept, later tasks still run, and
// rethrow_error() throws it on the caller's thread.
//
//   lockstep::OrderedWorker writer("metrics writer", /*capacity=*/16, /*wait_limit_s=*/1800);
//   writer.submit([=] { record(metrics); });  // blocks while 16 tasks are queued
//   writer.rethrow_error();                   // a task's error, if one failed
//   writer.drain();                           // every submitted task has run
//
// Nothing waits forever: submit() blocks while `capacity` tasks are queued
// (the running one not counted) and drain() until the queue is empty, each for
// at most `wait_limit_s` seconds (0: no limit); then they throw lockstep::Error
// naming the worker, the tasks queued and how long the running task has been
// running. A task that hangs (a collective whose peer died) thus surfaces as
// an error on the submitting thread instead of a trainer that waits forever,
// and a producer faster than the tasks cannot grow the queue without bound.
//
// The destructor DROPS the tasks that have not started and joins the running
// one. It runs when the owner is done with the worker -- after drain() on the
// normal path, or while unwinding from an error, when the queued tasks are
// collectives that peers may never join -- so running them there could hang.
// Call drain() first to have every task run.
//
// submit(), drain() and rethrow_error() may be called from several threads;
// a task must not call them on its own worker (it would wait for itself).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <c10/macros/Macros.h>

namespace lockstep {

class OrderedWorker {
 public:
  // `name` is what its errors call it ("metrics writer"). capacity >= 1;
  // wait_limit_s >= 0, 0 waiting without limit.
  OrderedWorker(std::string name, int capacity, double wait_limit_s);
  // Drops the tasks that have not started and joins the running one (see above).
  ~OrderedWorker();
  C10_DISABLE_COPY_AND_ASSIGN(OrderedWorker);

  // Queues `task` behind the others; blocks while `capacity` tasks are queued.
  // Throws, without queuing it, after waiting wait_limit_s.
  void submit(std::function<void()> task);
  // Returns once every submitted task has run; throws after waiting wait_limit_s.
  // Does not throw a task's error: rethrow_error() does.
  void drain();
  // Throws the first exception a task raised since the last call, if any.
  void rethrow_error();

  const std::string& name() const { return name_; }
  // Tasks queued and not yet started.
  int64_t queued() const;

 private:
  void loop();
  // "3 tasks are queued and the running one has been running for 12 s"; requires the lock.
  std::string describe() const;

  const std::string name_;
  const int capacity_;
  const double wait_limit_s_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;  // the worker waits for a task or stop
  std::condition_variable room_;  // submit() waits for room, drain() for an empty queue
  std::deque<std::function<void()>> tasks_;
  std::exception_ptr error_;
  bool busy_ = false;
  std::chrono::steady_clock::time_point running_since_;
  bool stopping_ = false;
  std::thread thread_;  // last: it starts once everything above exists
};

}  // namespace lockstep
