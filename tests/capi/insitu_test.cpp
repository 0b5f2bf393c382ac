// examples/insitu under `mpirun -np 2`: a heat solver in Fortran (through the
// `lockstep` module) and in C (through the C API), each started from
// MPI_COMM_WORLD, trains a surrogate of its own step while it runs. The
// surrogate's error on held-out states falls below the stated bound (0.05 of
// the error of predicting no change), and the checkpoint the run ends with,
// exported to TorchScript, loads in Python and predicts a field it never saw.
#include <gtest/gtest.h>

#include <regex>

#include "tests/support/capi_support.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

// The held-out errors a solver printed, in order.
std::vector<double> held_out_errors(const std::string& output) {
  std::vector<double> errors;
  std::regex line(R"(surrogate error on held-out states +([0-9.]+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    errors.push_back(std::stod((*it)[1]));
  }
  return errors;
}

TEST(InSitu, HeatSolversInFortranAndCTrainTheirSurrogateUnderMpirun) {
  if (auto problem = testing::mpirun_problem(); !problem.empty()) GTEST_SKIP() << problem;
  if (!testing::python_has("torch")) GTEST_SKIP() << "python3-torch is missing: it scripts the surrogate";
  testing::TempDir dir;
  const std::string examples = testing::source_dir() + "/examples/insitu";
  auto made = testing::run_command({testing::python(), examples + "/make_surrogate.py", dir.file("surrogate.pt")}, {}, 120);
  ASSERT_EQ(made.exit_code, 0) << made.output;

  for (const std::string language : {"fortran", "c"}) {
    const std::string program = testing::binary_dir() + "/examples/insitu_heat_" + language;
    if (language == "fortran" && !testing::file_exists(program)) {
      ADD_FAILURE() << program << " was not built (gfortran and Open MPI's Fortran bindings are needed)";
      continue;
    }
    auto run = testing::run_command(
        testing::mpirun_command(2, {program, examples + "/insitu.yaml", dir.file("surrogate.pt"), dir.file(language)}),
        {}, 300);
    EXPECT_EQ(run.exit_code, 0) << language << ":\n" << run.output;
    EXPECT_NE(run.output.find("is below the bound 0.05"), std::string::npos) << language << ":\n" << run.output;
    const auto errors = held_out_errors(run.output);
    ASSERT_GE(errors.size(), 4u) << language << ":\n" << run.output;
    EXPECT_LT(errors.back(), errors.front() / 4) << language << ": the surrogate did not learn";
    EXPECT_TRUE(testing::file_exists(dir.file(language + "/model_final.ckpt"))) << run.output;
  }

  auto exported = testing::export_checkpoint(dir.file("fortran/model_final.ckpt"), dir.file("trained.pt"),
                                             {"--format", "torchscript"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  auto checked = testing::run_command({testing::python(), examples + "/check.py", dir.file("trained.pt")}, {}, 120);
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

}  // namespace
}  // namespace lockstep
