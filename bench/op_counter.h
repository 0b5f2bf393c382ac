// OperatorCounter: how many ATen operators a piece of code calls, by name,
// on every thread, counting only outermost calls (an operator that another
// one calls inside itself is part of that one). On a GPU each outermost
// operator is at least one kernel launch, and a small model's step is paid
// for by its launches, so the count says where a step's host time goes on
// any machine, a CPU included, without timing anything.
//
//   lockstep::bench::OperatorCounter counter;           // counts from here
//   ... run some steps ...
//   std::map<std::string, int64_t> calls = counter.counts();
//
// One counter at a time in a process (it owns a global callback).
#pragma once

#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace lockstep::bench {

class OperatorCounter {
 public:
  OperatorCounter() {
    if (active().exchange(true)) throw std::logic_error("bench::OperatorCounter: one at a time");
    reset();
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&OperatorCounter::on_start, &OperatorCounter::on_end).scopes({at::RecordScope::FUNCTION}));
  }
  ~OperatorCounter() {
    at::removeCallback(handle_);
    active() = false;
  }
  OperatorCounter(const OperatorCounter&) = delete;
  OperatorCounter& operator=(const OperatorCounter&) = delete;

  void reset() {
    std::lock_guard<std::mutex> lock(mutex());
    table().clear();
  }
  std::map<std::string, int64_t> counts() const {
    std::lock_guard<std::mutex> lock(mutex());
    return table();
  }

 private:
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    if (depth()++ == 0) {
      std::lock_guard<std::mutex> lock(mutex());
      ++table()[fn.name()];
    }
    return nullptr;
  }
  static void on_end(const at::RecordFunction&, at::ObserverContext*) { --depth(); }

  static std::atomic<bool>& active() {
    static std::atomic<bool> flag{false};
    return flag;
  }
  static int& depth() {
    thread_local int value = 0;
    return value;
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::string, int64_t>& table() {
    static std::map<std::string, int64_t> counts;
    return counts;
  }

  at::CallbackHandle handle_;
};

}  // namespace lockstep::bench
