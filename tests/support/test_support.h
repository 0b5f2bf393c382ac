// Helpers shared by lockstep's tests: temporary directories, running the
// lockstep binary or a worker program, reading files.
//
//   lockstep::testing::TempDir dir;                 // removed at scope exit
//   auto result = lockstep::testing::run_command({lockstep::testing::lockstep_binary(), "--help"});
//   EXPECT_EQ(result.exit_code, 0);
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>

namespace lockstep::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  C10_DISABLE_COPY_AND_ASSIGN(TempDir);
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;      // exit status, or 128 + signal number
  std::string output;      // stdout and stderr, interleaved
  double seconds = 0;      // wall time
};

// Runs argv (no shell) with extra "NAME=value" environment entries, capturing
// output. Kills the process group after timeout_s seconds (exit_code 124).
CommandResult run_command(const std::vector<std::string>& argv,
                          const std::vector<std::string>& extra_env = {},
                          double timeout_s = 300);

// The Python that holds the PyTorch tests compare against: LOCKSTEP_TEST_PYTHON
// when set (a GPU host's pip PyTorch: scripts/gpu-check.sh sets it), else
// Debian's /usr/bin/python3 with python3-torch.
std::string python();

// The command line that starts python()'s torchrun, to which its own
// arguments are appended: `torch.distributed.run` through a shim that makes
// Debian's torch 2.x (built without libuv) usable and binds it to 127.0.0.1,
// with explicit --redirects/--tee (Debian's torch 1.13 on Python 3.11 crashes
// on their defaults). For tests and benches that compare with torchrun.
std::vector<std::string> torchrun();

// Whether python() imports `module` (torch, torchvision, ...): tests against
// PyTorch skip without it. Asked once per module.
bool python_has(const std::string& module);
// Why a test against python()'s torch cannot run, or "" where it can: python
// has torch and `probe` (Python code, run once) exits 0; else "<python> has no torch"
// or "<python>'s torch <lacking>".
std::string python_torch_lacks(const std::string& probe, const std::string& lacking);

// The message of the exception `action` throws, "<no error>" when it throws none.
std::string error_of(const std::function<void()>& action);

std::string source_dir();                 // the checkout
std::string binary_dir();                 // the build tree
std::string lockstep_binary();            // <build>/bin/lockstep
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& content);
bool file_exists(const std::string& path);

// `lockstep ckpt export CHECKPOINT -o OUT` with further arguments (--format, --ema, --dtype).
//   auto exported = testing::export_checkpoint(dir.file("run/model_final.ckpt"), dir.file("w.pt"), {"--format", "pt"});
CommandResult export_checkpoint(const std::string& checkpoint, const std::string& out,
                                const std::vector<std::string>& args = {});

// The number that follows `marker` in `text`; NaN where `marker` is absent.
//   EXPECT_GT(testing::number_after(run.output, "Final test accuracy/top1: "), 0.85) << run.output;
double number_after(const std::string& text, const std::string& marker);

}  // namespace lockstep::testing
