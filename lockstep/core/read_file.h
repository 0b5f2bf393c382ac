// read_file: a whole file's bytes, in one allocation.
//
//   std::string bytes = lockstep::read_file("data/cat.jpg");
//
// Throws lockstep::Error naming the file and the system's reason
// ("data/cat.jpg: cannot open (No such file or directory)").
#pragma once

#include <string>

namespace lockstep {

std::string read_file(const std::string& path);

}  // namespace lockstep
