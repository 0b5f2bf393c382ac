// What `lockstep run` itself writes: its own messages, and its workers'
// output passed on line by line.
//
//   say("restarting all workers (restart 1 of 3)");   // "lockstep run: restarting ..." on stderr
//   write_all(STDOUT_FILENO, "[rank0]: loss 0.52\n");
#pragma once

#include <string>

namespace lockstep {

// Writes all of `text`; on a closed terminal or pipe it is lost and the job goes on.
void write_all(int fd, const std::string& text);

// "lockstep run: <message>" on the launcher's stderr.
void say(const std::string& message);

}  // namespace lockstep
