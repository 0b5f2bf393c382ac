// Named fault points: test machinery that makes a process die where a real
// fault would strike, so reliability tests can prove recovery end to end.
//
// With LOCKSTEP_FAULT_KILL_AT=<point> (or <point>@<n> for the n-th time it is
// reached, default 1) a process SIGKILLs itself when it reaches that point.
// AtomicFileWriter reaches "write:<file name>" after each chunk it writes, so
//
//   LOCKSTEP_FAULT_KILL_AT=write:model_0000019.ckpt@2 lockstep train cfg.yaml
//
// dies in the middle of saving that checkpoint, leaving a partial file.
// Reading a checkpoint file reaches "read:<file name>". The FaultInjection
// hook (hooks/fault_injection.h) kills at a training iteration.
//
// SIGKILL, not an exception: nothing unwinds, no destructor tidies up -- what
// a power cut, the OOM killer or `kill -9` leave behind is what is tested.
//
// LOCKSTEP_FAULT_THROW_AT=<point>[@n] throws a lockstep::Error there instead
// ("lockstep fault injection: reached fault point ..."): a failure the process
// survives, as a full disk or an unreadable file is, for tests of what the
// other ranks do when one fails and carries on. LOCKSTEP_FAULT_RANK=<r> arms
// either only in the process whose RANK is r. LOCKSTEP_FAULT_STALL_AT=<point>[@n]
// stops there for good (a disk that stopped answering, a peer that never
// replies), for tests of what ends a process that is stuck.
#pragma once

#include <string>

namespace lockstep {

// Kills this process with SIGKILL if LOCKSTEP_FAULT_KILL_AT names `point`
// (counting how often it was reached). Costs one string compare when set,
// nothing else when unset.
void fault_point(const std::string& point);

// Writes "lockstep fault injection: <why>; SIGKILL" to stderr and SIGKILLs this process.
[[noreturn]] void die_by_fault_injection(const std::string& why);

}  // namespace lockstep
