// The fuzz build links the parsers without the engine, so the fault points
// that reliability tests arm (lockstep/hooks/fault_injection.h) are inert
// here: fuzzing looks for parser faults, not injected ones.
#include <string>

namespace lockstep {
void fault_point(const std::string& /*point*/) {}
}  // namespace lockstep
