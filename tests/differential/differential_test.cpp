// The differential suite: lockstep trains a case on the user's path (a YAML
// config, `lockstep train --nproc N`, the launcher, the loader, load_from, the
// final checkpoint exported with `lockstep ckpt export`), PyTorch trains the
// same case with its own DistributedDataParallel (pytorch_reference.py), and
// the final weights are compared tensor by tensor.
//
// One JSON case feeds both sides, so they cannot drift: the reference script
// reads it directly, and lockstep_config() writes the equivalent YAML.
//
// Tolerances. lockstep and Debian's python3-torch run the same libtorch build
// (1.13) with one thread per process, so wherever lockstep performs the same
// floating-point operations in the same order as PyTorch the result is
// bitwise equal, and the suite demands exactly that (tolerance 0): every DDP
// case, separate DDP, clipping, accumulation, AdamW, the schedulers,
// BatchNorm, bf16 autocast, and a module scripted in Python (TorchScriptModel,
// where both sides run the same .pt file). FSDP cases compare against PyTorch's DDP
// (PyTorch 1.13's FSDP does not run on this Python) within 1e-5 relative after
// 20 SGD-momentum steps with weight decay: a sharded reduction may add in
// another order (kFsdpTolerance). The relative difference of a tensor is
// max|lockstep - pytorch| / max|pytorch|; each case states its reason. The
// cases live in differential_cases.cpp.
//
// Cost: 45 runs of `lockstep train` (or of the C API's test program), about
// 4 s each on 2 cores, plus one Python process for the references when the
// cache in the build tree is cold.
#include <fcntl.h>
#include <c10/macros/Macros.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/core/error.h"
#include "tests/differential/differential_cases.h"
#include "tests/differential/differential_config.h"
#include "tests/support/capi_support.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using nlohmann::json;
using differential::all_cases;
using differential::DiffCase;
using differential::lockstep_config;
using differential::on_gpu;
using differential::pinned_to_cpu;


std::string reference_script() { return testing::source_dir() + "/tests/differential/pytorch_reference.py"; }

// Whether python3-torch is installed, without paying for importing it.
bool pytorch_available() {
  static const bool available =
      testing::run_command({testing::python(), "-c",
                            "import importlib.util, sys; sys.exit(not (importlib.util.find_spec('torch') and "
                            "importlib.util.find_spec('numpy')))"},
                           {}, 60)
          .exit_code == 0;
  return available;
}


bool cuda_available() { return torch::cuda::is_available(); }

// PyTorch's initial and final weights for case `c`, kept in the build tree
// per case and version of the reference script. The first test that misses
// one computes every missing reference in one Python process (importing
// torch once instead of once per case).
struct Reference {
  std::string init;
  std::string final_weights;
};

// A case as PyTorch's side sees it: "lockstep_env" (environment variables
// for lockstep's run only) changes nothing there, so such a case shares its
// reference with the case without them.
json reference_case(json c) {
  c.erase("lockstep_env");
  return c;
}

Reference cached_reference(const json& c) {
  const std::string key =
      std::to_string(std::hash<std::string>()(reference_case(c).dump() + testing::read_file(reference_script())));
  const std::string dir = testing::binary_dir() + "/differential_cache/" + key;
  return Reference{dir + "/init.safetensors", dir + "/pytorch.safetensors"};
}

// Note [One reference writer]: ctest runs two differential cases at a time
// (Note [Multi-process tests side by side]), and on a cold cache both miss
// their reference at once. Two batch processes writing the same init and
// final files race (one replaces a file the other has just moved, or trains
// from an init being rewritten: CI saw the reference script fail so). An
// exclusive flock on the cache folder makes the first miss compute every
// reference while the other waits, then finds its file and computes nothing.
class CacheLock {
 public:
  explicit CacheLock(const std::string& dir) {
    testing::run_command({"mkdir", "-p", dir});
    fd_ = ::open((dir + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0 || ::flock(fd_, LOCK_EX) != 0) ADD_FAILURE() << "cannot lock " << dir << "/.lock";
  }
  ~CacheLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  C10_DISABLE_COPY_AND_ASSIGN(CacheLock);

 private:
  int fd_ = -1;
};

// Whether the reference script wrote `ref`'s weights, or why it cannot
// (final_weights + ".unsupported": this PyTorch cannot run the case).
bool reference_done(const Reference& ref) {
  return testing::file_exists(ref.final_weights) || testing::file_exists(ref.final_weights + ".unsupported");
}

Reference reference_for(const json& c) {
  Reference ref = cached_reference(c);
  if (reference_done(ref)) return ref;
  CacheLock lock(testing::binary_dir() + "/differential_cache");
  if (reference_done(ref)) return ref;  // written while this case waited
  json jobs = json::array();
  std::set<std::string> queued;  // cases that differ only in lockstep's strategy share a reference
  for (const auto& other : all_cases()) {
    if (on_gpu(other.reference) && !cuda_available()) continue;  // PyTorch's side would need the GPU too
    Reference missing = cached_reference(other.reference);
    if (reference_done(missing) || !queued.insert(missing.final_weights).second) continue;
    const std::string dir = missing.init.substr(0, missing.init.rfind('/'));
    testing::run_command({"mkdir", "-p", dir});
    jobs.push_back({{"case", reference_case(other.reference)}, {"init", missing.init}, {"out", missing.final_weights}});
  }
  testing::TempDir scratch;
  testing::write_file(scratch.file("jobs.json"), jobs.dump());
  // Under the test's own 600 s, so a stuck reference fails with its output.
  auto result = testing::run_command({testing::python(), reference_script(), "batch", scratch.file("jobs.json")}, {}, 480);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return ref;
}

// Trains `c` through `lockstep train` with `strategy` and returns the largest
// relative difference of any tensor from PyTorch's final weights.
double train_and_compare(const json& c, const std::string& strategy) {
  Reference ref = reference_for(c);
  testing::TempDir dir;
  const std::string config = dir.file("case.yaml");
  testing::write_file(config, lockstep_config(c, on_gpu(c) ? strategy : pinned_to_cpu(strategy), ref.init));
  const std::string nproc = std::to_string(c["world"].get<int>());
  std::vector<std::string> command{testing::lockstep_binary(), "train", config, "--work-dir", dir.file("work"),
                                   "--nproc", nproc};
  if (c["model"]["type"] == "DCGAN") {
    // The GAN is a user's own program (examples/gan), started by the launcher.
    command = {testing::lockstep_binary(), "run",    "--standalone", "--nproc-per-node", nproc,
               "--",                       testing::binary_dir() + "/examples/gan", config, "--work-dir",
               dir.file("work")};
  } else if (c.contains("driver")) {
    // A C program that owns its loop and feeds lockstep's C API the batches
    // lockstep's loader would give each rank (tests/capi/capi_train.c),
    // started by lockstep's launcher or by Open MPI's mpirun.
    const int64_t samples = c["iters"].get<int64_t>() * c["batch"].get<int64_t>() * c["world"].get<int64_t>();
    testing::write_capi_training_data(dir.file("data.bin"), samples);
    const std::vector<std::string> program{testing::binary_dir() + "/tests/capi_train", config, dir.file("data.bin"),
                                           dir.file("work"), std::to_string(c["iters"].get<int64_t>()),
                                           std::to_string(c["batch"].get<int64_t>())};
    if (c["driver"] == "capi_mpirun") {
      command = testing::mpirun_command(c["world"].get<int>(), program, /*use_communicator=*/true);
    } else {
      command = {testing::lockstep_binary(), "run", "--standalone", "--nproc-per-node", nproc, "--"};
      command.insert(command.end(), program.begin(), program.end());
    }
  }
  auto run = testing::run_command(command, c.value("lockstep_env", std::vector<std::string>{}), 600);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  if (run.exit_code != 0) return 1e9;
  auto exported = testing::export_checkpoint(dir.file("work/model_final.ckpt"), dir.file("lockstep.safetensors"));
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  auto compared = testing::run_command({testing::python(), reference_script(), "compare", dir.file("lockstep.safetensors"),
                                        ref.final_weights});
  EXPECT_EQ(compared.exit_code, 0) << compared.output;
  if (compared.exit_code != 0) return 1e9;
  json differences = json::parse(compared.output);
  double worst = 0;
  for (const auto& item : differences.items()) worst = std::max(worst, item.value().get<double>());
  std::cout << "relative differences: " << differences.dump() << "\nlargest: " << worst << "\n";
  return worst;
}

class Differential : public ::testing::TestWithParam<DiffCase> {
 protected:
  void SetUp() override {
    if (!pytorch_available()) GTEST_SKIP() << "python3-torch is not installed: nothing to compare against";
  }
};

TEST_P(Differential, FinalWeightsMatchPyTorch) {
  const DiffCase& c = GetParam();
  if (on_gpu(c.reference) && !cuda_available()) GTEST_SKIP() << "no CUDA device: this case runs on GPU 0";
  if (c.reference.value("driver", std::string()) == "capi_mpirun") {
    if (auto problem = testing::mpirun_problem(); !problem.empty()) GTEST_SKIP() << problem;
  }
  const std::string unsupported = reference_for(c.reference).final_weights + ".unsupported";
  if (testing::file_exists(unsupported)) {
    GTEST_SKIP() << testing::read_file(unsupported);
  }
  SCOPED_TRACE(c.name + ": " + (c.tolerance == 0 ? std::string("bitwise") : str_cat("within ", c.tolerance, " relative")) +
               ", " + c.why);
  const double worst = train_and_compare(c.reference, c.strategy);
  if (c.tolerance == 0) {
    EXPECT_EQ(worst, 0.0);
  } else {
    EXPECT_LE(worst, c.tolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(AgainstPyTorch, Differential, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<DiffCase>& info) { return info.param.name; });

}  // namespace
}  // namespace lockstep
