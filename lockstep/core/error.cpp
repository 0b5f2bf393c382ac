#include "lockstep/core/error.h"

#include <c10/util/Exception.h>

namespace lockstep {

std::string short_torch_message(const std::exception& error) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error)) {
    return torch_error->what_without_backtrace();
  }
  return error.what();
}

std::string describe_exception(const std::exception_ptr& error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& caught) {
    std::string message = short_torch_message(caught);
    auto newline = message.find("\nException raised from");
    if (newline != std::string::npos) message.resize(newline);
    return message;
  } catch (...) {
    return "unknown exception";
  }
}

void rethrow_with_context(const std::string& context) {
  try {
    throw;
  } catch (const TimeoutError& error) {
    throw TimeoutError(context + ": " + error.what());
  } catch (const PeerLostError& error) {
    throw PeerLostError(context + ": " + error.what());
  } catch (const DistributedError& error) {
    throw DistributedError(context + ": " + error.what());
  } catch (const std::exception& error) {
    std::string message = short_torch_message(error);
    // Keep only the first line of libtorch's message; the rest is a C++ trace.
    auto newline = message.find("\nException raised from");
    if (newline != std::string::npos) message.resize(newline);
    throw Error(context + ": " + message);
  }
}

}  // namespace lockstep
