// The installed package: `cmake --install` the build tree into a fresh
// prefix, build examples/consumer (a separate CMake project) against it with
// find_package(Lockstep), and run it. Proves the exported lockstep::lockstep
// target carries what a consumer needs (headers, torch's flags and ABI
// define, USE_C10D_GLOO, the dependent libraries) and that the installed
// binaries find their libraries.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tests/support/test_support.h"

namespace lockstep {
namespace {

// The -D_GLIBCXX_USE_CXX11_ABI=N in a compile command, or "" when it has none.
std::string abi_define(const std::string& command) {
  std::smatch found;
  return std::regex_search(command, found, std::regex("-D_GLIBCXX_USE_CXX11_ABI=[01]")) ? found.str() : "";
}

// How this build compiled liblockstep's first source.
std::string library_compile_command() {
  auto commands = nlohmann::json::parse(testing::read_file(testing::binary_dir() + "/compile_commands.json"));
  return commands.empty() ? "" : commands[0].value("command", "");
}

// The cmake that configured this build (falls back to the one on PATH).
std::string cmake_command() {
  std::ifstream cache(testing::binary_dir() + "/CMakeCache.txt");
  std::string line;
  const std::string key = "CMAKE_COMMAND:INTERNAL=";
  while (std::getline(cache, line)) {
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  }
  return "cmake";
}

bool have_ccache() { return testing::run_command({"ccache", "--version"}).exit_code == 0; }

testing::CommandResult run_logged(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
                                  double timeout_s = 300) {
  auto result = testing::run_command(argv, env, timeout_s);
  std::string line;
  for (const auto& arg : argv) line += arg + " ";
  std::cout << "$ " << line << "(" << result.seconds << " s, exit " << result.exit_code << ")" << std::endl;
  return result;
}

// Where the dynamic loader finds `library` for `binary`, as a canonical path
// ("" when ldd does not list it). ldd prints the path the loader opened, which
// for an $ORIGIN RPATH is the unnormalised "<prefix>/bin/../lib/..." form, so
// the test compares canonical paths, never ldd's text.
std::string loaded_from(const std::string& binary, const std::string& library) {
  auto ldd = run_logged({"ldd", binary}, {"LD_LIBRARY_PATH="});
  EXPECT_EQ(ldd.exit_code, 0) << ldd.output;
  std::istringstream lines(ldd.output);
  std::string line;
  const std::regex entry("^\\s*(\\S+) => (\\S+) \\(0x[0-9a-f]+\\)");
  std::smatch match;
  while (std::getline(lines, line)) {
    if (std::regex_search(line, match, entry) && match[1].str().rfind(library, 0) == 0) {
      return std::filesystem::canonical(match[2].str()).string();
    }
  }
  ADD_FAILURE() << binary << " does not load " << library << ":\n" << ldd.output;
  return "";
}

// The installed headers are the public API and nothing else: no internal/
// folder, none that calls itself internal, and every lockstep header they
// include is installed too, so a consumer never needs the source tree.
void expect_only_the_public_api(const std::string& include_dir) {
  namespace fs = std::filesystem;
  const std::regex says_internal("\\binternal\\b", std::regex::icase);
  const std::regex lockstep_include("#include \"(lockstep/[^\"]+)\"");
  int headers = 0;
  for (const auto& entry : fs::recursive_directory_iterator(include_dir + "/lockstep")) {
    if (!entry.is_regular_file() || entry.path().extension() != ".h") continue;
    ++headers;
    const std::string path = entry.path().string();
    EXPECT_EQ(path.find("/internal/"), std::string::npos) << path << ": an internal header was installed";
    const std::string text = testing::read_file(path);
    EXPECT_FALSE(std::regex_search(text, says_internal)) << path << " says it is internal, and was installed";
    for (std::sregex_iterator it(text.begin(), text.end(), lockstep_include), end; it != end; ++it) {
      EXPECT_TRUE(testing::file_exists(include_dir + "/" + (*it)[1].str()))
          << path << " includes " << (*it)[1].str() << ", which is not installed";
    }
  }
  EXPECT_GT(headers, 100) << "the public headers were not installed";
}

TEST(PackageTest, ConsumerBuildsAndTrainsAgainstTheInstalledPackage) {
  testing::TempDir dir;
  const std::string prefix = dir.file("prefix");
  const std::string build = dir.file("consumer-build");
  const std::string cmake = cmake_command();

  auto install = run_logged({cmake, "--install", testing::binary_dir(), "--prefix", prefix});
  ASSERT_EQ(install.exit_code, 0) << install.output;
  for (const char* installed : {"include/lockstep/runner/runner.h", "include/lockstep/core/error.h",
                                "lib/cmake/Lockstep/LockstepConfig.cmake",
                                "lib/cmake/Lockstep/LockstepConfigVersion.cmake",
                                "lib/cmake/Lockstep/LockstepTargets.cmake", "bin/lockstep"}) {
    EXPECT_TRUE(testing::file_exists(prefix + "/" + installed)) << installed << " was not installed";
  }
  EXPECT_FALSE(testing::file_exists(prefix + "/include/lockstep/config/config_test_util.h"))
      << "test helpers were installed";
  expect_only_the_public_api(prefix + "/include");

  // A fresh prefix and build directory each run; ccache (when present) keeps
  // the one torch-heavy compile cheap after the first run: paths under the
  // temporary directory are hashed relative to it.
  std::vector<std::string> configure{cmake, "-S", testing::source_dir() + "/examples/consumer", "-B", build,
                                     "-DCMAKE_PREFIX_PATH=" + prefix, "-DCMAKE_BUILD_TYPE=Release",
                                     "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
                                     "-DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON"};
  std::vector<std::string> env{"CCACHE_BASEDIR=" + dir.path(), "CCACHE_NOHASHDIR=1"};
  if (have_ccache()) configure.push_back("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache");
  auto configured = run_logged(configure, env);
  ASSERT_EQ(configured.exit_code, 0) << configured.output;
  // The package came from the prefix, not from the source or build tree.
  EXPECT_NE(testing::read_file(build + "/CMakeCache.txt").find("Lockstep_DIR:PATH=" + prefix + "/lib/cmake/Lockstep"),
            std::string::npos);

  auto built = run_logged({cmake, "--build", build, "-j", "2"}, env, 600);
  ASSERT_EQ(built.exit_code, 0) << built.output;

  // What the target handed the compiler.
  auto commands = nlohmann::json::parse(testing::read_file(build + "/compile_commands.json"));
  ASSERT_EQ(commands.size(), 1u);
  const std::string command = commands[0].value("command", "");
  EXPECT_NE(command.find("-DUSE_C10D_GLOO"), std::string::npos) << command;
  // The C++ ABI define liblockstep was compiled with, or none where libtorch
  // sets none (2.7 and later know only the C++11 ABI).
  EXPECT_EQ(abi_define(command), abi_define(library_compile_command())) << command;
  EXPECT_NE(command.find(prefix + "/include"), std::string::npos) << command;
  for (const std::string flag : {"-I", "-isystem "}) {
    EXPECT_EQ(command.find(flag + testing::source_dir()), std::string::npos)
        << "the consumer reached into the source tree: " << command;
  }

  // The consumer links the installed library, and learns: 4 classes, chance is 0.25.
  const std::string installed_library =
      std::filesystem::canonical(prefix + "/lib/liblockstep.so").string();  // the versioned file
  EXPECT_EQ(loaded_from(build + "/consumer", "liblockstep.so"), installed_library);
  auto trained = run_logged({build + "/consumer", dir.file("work"), "20"});
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(trained.output, match, std::regex("consumer: accuracy/top1 = ([0-9.eE+-]+)")))
      << trained.output;
  EXPECT_GT(std::stod(match[1]), 0.5) << trained.output;
  EXPECT_TRUE(testing::file_exists(dir.file("work/model_final.ckpt")));

  // The installed command finds liblockstep through its RPATH ($ORIGIN/../lib).
  auto help = run_logged({prefix + "/bin/lockstep", "--help"}, {"LD_LIBRARY_PATH="});
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_EQ(loaded_from(prefix + "/bin/lockstep", "liblockstep.so"), installed_library);
}

}  // namespace
}  // namespace lockstep
