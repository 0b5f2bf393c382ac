// Starting programs under Open MPI's mpirun in tests: whether it can be done
// here, and the command line (as root too, more ranks than cores allowed).
//
//   if (auto problem = lockstep::testing::mpirun_problem(/*needs_mpi_build=*/false); !problem.empty())
//     GTEST_SKIP() << problem;
//   auto argv = lockstep::testing::mpirun_command(4, {lockstep_binary(), "train", config});
//
// Header-only, so that any test binary can use it without build changes.
#pragma once

#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace lockstep::testing {

// Whether this lockstep was built with MPI (tests/CMakeLists.txt writes the marker).
inline bool built_with_mpi() {
  const std::string marker = binary_dir() + "/tests/lockstep_with_mpi";
  return file_exists(marker) && read_file(marker).rfind("ON", 0) == 0;
}

// Empty when programs can be started with mpirun here, else why not;
// `needs_mpi_build`: also lockstep must have been built with MPI.
inline std::string mpirun_problem(bool needs_mpi_build = true) {
  if (needs_mpi_build && !built_with_mpi()) {
    return "lockstep was built without MPI (libopenmpi-dev not found at configure time)";
  }
  static const std::string problem = [] {
    auto result = run_command({"mpirun", "--version"}, {}, 60);
    return result.exit_code == 0 ? std::string() : "mpirun does not run here: " + result.output;
  }();
  return problem;
}

// argv of `mpirun -np N PROGRAM [--mpi] ARGS...`. `use_communicator`: the
// program takes --mpi after its name and starts lockstep from MPI_COMM_WORLD.
// `exported`: environment variables passed on with -x.
inline std::vector<std::string> mpirun_command(int ranks, const std::vector<std::string>& program,
                                               bool use_communicator = false,
                                               const std::vector<std::string>& exported = {}) {
  std::vector<std::string> argv{"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(ranks)};
  for (const auto& name : exported) argv.insert(argv.end(), {"-x", name});
  argv.push_back(program.at(0));
  if (use_communicator) argv.push_back("--mpi");
  argv.insert(argv.end(), program.begin() + 1, program.end());
  return argv;
}

}  // namespace lockstep::testing
