// Waiting for one FSDP unit's collective (a gather or a gradient reduction):
// a timeout or a lost peer becomes an error that says what it means for FSDP,
// that the ranks named ran different units or steps.
//
//   wait_for_unit(*work, unit.path(), "gathering its parameters");
#pragma once

#include <string>

namespace lockstep {
class Work;
}  // namespace lockstep

namespace lockstep::fsdp {

void wait_for_unit(Work& work, const std::string& path, const char* what);

}  // namespace lockstep::fsdp
