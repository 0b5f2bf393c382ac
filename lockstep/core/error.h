// lockstep::Error and LOCKSTEP_CHECK: the one way lockstep reports a fault.
//
// Every error a user can cause (a bad config value, a corrupt file, a rank that
// disagrees) is an exception whose message names what the user needs to fix it:
// the file and line, the config key, the rank, the parameter.
//
//   LOCKSTEP_CHECK(batch_size > 0, config.where("batch_size"),
//                  ": batch_size must be positive, got ", batch_size);
//   // throws lockstep::Error("cnn.yaml:12 (key train_dataloader.batch_size):
//   //                          batch_size must be positive, got 0")
//
// A c10::Error from libtorch is caught where lockstep knows the context and
// rethrown with it (see rethrow_with_context), never swallowed.
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace lockstep {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Raised where ranks fail together: a collective that failed (a peer that
// died, a closed connection), ranks out of step, or another rank's failure
// that every rank agreed on (comm/agreement.h).
class DistributedError : public Error {
 public:
  using Error::Error;
};

// Raised when a collective or rendezvous wait runs past its timeout.
class TimeoutError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

// Raised when a collective fails because peers it was waiting for closed
// their connections without ever entering it: they gave up in another
// collective (a rank that times out closes its connections) or their process
// exited. For the program that is what a timeout is, the ranks were not at
// the same point, only reported sooner; catch both where that is explained.
class PeerLostError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

// Concatenates anything streamable into one string.
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

// Rethrows the exception in flight (a c10::Error, std::exception, ...) as a
// lockstep::Error whose message starts with `context`. Call inside a catch.
[[noreturn]] void rethrow_with_context(const std::string& context);

// The first line of a c10::Error's message (libtorch appends a long C++ trace).
std::string short_torch_message(const std::exception& error);

// The message of any exception (short_torch_message for a std::exception,
// "unknown exception" for anything else); empty for a null pointer.
std::string describe_exception(const std::exception_ptr& error);

}  // namespace lockstep

#define LOCKSTEP_CHECK(condition, ...)                                   \
  do {                                                                   \
    if (!(condition)) {                                                  \
      throw ::lockstep::Error(::lockstep::str_cat(__VA_ARGS__));         \
    }                                                                    \
  } while (false)

#define LOCKSTEP_FAIL(...) throw ::lockstep::Error(::lockstep::str_cat(__VA_ARGS__))
