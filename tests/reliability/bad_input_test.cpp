// Every bad input a user can hand `lockstep train` / `lockstep run` ends in
// a message that names the culprit (file, line, config key, path, port,
// ranks) and a non-zero exit -- never a crash, a core dump or a hang.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <regex>

#include "tests/support/small_job.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

using testing::contains;

// The 1-based line of the first line of `text` holding `needle`.
int line_of(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos) << needle;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
}

// The reliability config with one substring replaced, written to `name`.
std::string variant(const testing::TempDir& dir, const std::string& name, const std::string& from,
                    const std::string& to) {
  std::string text = testing::small_job_config();
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  testing::write_file(dir.file(name), text);
  return dir.file(name);
}

std::string where(const std::string& path, const std::string& needle) {
  return path + ":" + std::to_string(line_of(testing::read_file(path), needle));
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// IDX files whose headers announce all of Fashion-MNIST's training set but
// that end after a few bytes, as an interrupted download leaves them.
std::string truncated_fashion_mnist(const testing::TempDir& dir) {
  const std::string root = dir.file("truncated_data");
  std::filesystem::create_directories(root);
  write_bytes(root + "/train-images-idx3-ubyte", {0, 0, 8, 3, 0, 0, 0xea, 0x60, 0, 0, 0, 28, 0, 0, 0, 28, 1, 2, 3});
  write_bytes(root + "/train-labels-idx1-ubyte", {0, 0, 8, 1, 0, 0, 0xea, 0x60, 1, 2});
  return root;
}

// A listening socket that holds a port for the scope of a test.
class BoundPort {
 public:
  BoundPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t length = sizeof(address);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 && listen(fd_, 1) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port_ = ntohs(address.sin_port);
    }
  }
  ~BoundPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct BadInput {
  std::string name;
  // Prepares the files it needs and returns the command line.
  std::function<std::vector<std::string>(const testing::TempDir&)> command;
  // Parts the output must hold; computed after command() ran.
  std::function<std::vector<std::string>(const testing::TempDir&)> expected;
  std::vector<std::string> env = {};
};

std::string work(const testing::TempDir& dir, const std::string& name) { return dir.file("work_" + name); }

// A bad value in the config: the small job's config with `from` replaced by
// `to`, written to <name>.yaml; the message names that file, the line of `to`,
// and then says `says` (the key and what is wrong with its value).
BadInput config_edit(const std::string& name, const std::string& from, const std::string& to,
                     const std::string& says) {
  const std::string file = name + ".yaml";
  return {name,
          [=](const testing::TempDir& d) { return testing::train_argv(variant(d, file, from, to), work(d, name)); },
          [=](const testing::TempDir& d) { return std::vector<std::string>{where(d.file(file), to) + says}; }};
}

// The checkpoint of the small job trained one iteration with `hidden` as its
// hidden layers (config <name>.yaml, work dir work(dir, name)).
std::string one_iteration_checkpoint(const testing::TempDir& dir, const std::string& name, const std::string& hidden) {
  const std::string config = variant(dir, name + ".yaml", "hidden: [32]", "hidden: " + hidden);
  auto run = testing::run_command(testing::train_argv(config, work(dir, name), {"train_cfg.max_iters=1"}), {}, 120);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return work(dir, name) + "/model_final.ckpt";
}

TEST(BadInput, EveryBadInputFailsWithAMessageNamingItAndANonZeroExit) {
  testing::TempDir dir;
  const std::string good = testing::write_small_job(dir);
  BoundPort taken;
  ASSERT_GT(taken.port(), 0);
  const std::string ddp = testing::ddp_strategy_line();

  const std::vector<BadInput> cases{
      {"malformed_yaml",
       [&](const auto& d) {
         return testing::train_argv(variant(d, "malformed.yaml", "hidden: [32]", "hidden: [32"), work(d, "m"));
       },
       [&](const auto& d) { return std::vector<std::string>{"end of sequence flow not found"}; }},
      {"stray_comma_override",  // found by fuzz_config: yaml-cpp's LoadAll looped forever on it
       [&](const auto& d) { return testing::train_argv(good, work(d, "c"), {"model.hidden=,"}); },
       [&](const auto&) {
         return std::vector<std::string>{"--set 'model.hidden=,': --set: holds more than one YAML document"};
       }},
      config_edit("unknown_type", "type: MLP", "type: MLPP",
                  " (key model.type): unknown model type 'MLPP'; registered model types: "),
      config_edit("wrong_value_type", "in_features: 64", "in_features: sixty",
                  " (key model.in_features): expected an integer, got 'sixty'"),
      config_edit("negative_lr", "lr: 0.05", "lr: -0.05",
                  " (key optim_wrapper.optimizer.lr): lr must be positive, got -0.05"),
      config_edit("zero_batch_size", "batch_size: 8", "batch_size: 0",
                  " (key train_dataloader.batch_size): batch_size must be positive, got 0"),
      {"missing_dataset_file",
       [&](const auto& d) {
         return testing::train_argv(good, work(d, "md"),
                                    {"train_dataloader.dataset={_delete_: true, type: FashionMNIST, root: " +
                                     d.file("no_such_dir") + ", split: train}"});
       },
       [&](const auto& d) {
         return std::vector<std::string>{"(key train_dataloader.dataset.root): FashionMNIST: missing file " +
                                         d.file("no_such_dir") + "/train-images-idx3-ubyte.gz"};
       }},
      {"truncated_dataset_file",
       [&](const auto& d) {
         return testing::train_argv(good, work(d, "td"),
                                    {"train_dataloader.dataset={_delete_: true, type: FashionMNIST, root: " +
                                     truncated_fashion_mnist(d) + ", split: train}"});
       },
       [&](const auto& d) {
         return std::vector<std::string>{d.file("truncated_data") + "/train-images-idx3-ubyte: truncated: header says "
                                         "60000x28x28 = 47040000 bytes, file holds 3"};
       }},
      {"load_from_another_model",
       [&](const auto& d) {
         auto argv = testing::train_argv(good, work(d, "lf"));
         argv.insert(argv.end(), {"--load-from", one_iteration_checkpoint(d, "other", "[16, 8]")});
         return argv;
       },
       [&](const auto& d) {
         const std::string file = work(d, "other") + "/model_final.ckpt";
         return std::vector<std::string>{"load_from: not one tensor of " + file + " fits the model",
                                         "  layers.1.weight: " + file + " has [16, 64], the model has [32, 64]",
                                         file + " holds keys the model does not use:\n  layers.5.{bias, weight}"};
       }},
      {"resume_from_another_model",
       [&](const auto& d) {
         one_iteration_checkpoint(d, "rs", "[16]");
         auto argv = testing::train_argv(variant(d, "deeper.yaml", "hidden: [32]", "hidden: [32, 16]"), work(d, "rs"));
         argv.push_back("--resume");
         return argv;
       },
       [&](const auto& d) {
         const std::string file = work(d, "rs") + "/model_final.ckpt";
         return std::vector<std::string>{"cannot load the model weights from " + file,
                                         "  layers.3.weight: " + file + " has [10, 16], the model has [16, 32]",
                                         "Some model parameters or buffers are not in " + file +
                                             ":\n  layers.5.{bias, weight}"};
       }},
      {"port_in_use",
       [&](const auto& d) {
         return std::vector<std::string>{testing::lockstep_binary(), "run", "--nproc-per-node", "2", "--master-port",
                                         std::to_string(taken.port()), "--", testing::lockstep_binary(), "train", good,
                                         "--work-dir", work(d, "p")};
       },
       [&](const auto&) {
         return std::vector<std::string>{"lockstep run: cannot host the rendezvous store on port " +
                                             std::to_string(taken.port()),
                                         "Address already in use", "choose another --master-port"};
       }},
      {"world_size_not_the_number_of_processes",
       // The job is told it has two machines of two workers; only this one comes.
       [&](const auto& d) {
         return std::vector<std::string>{testing::lockstep_binary(), "run", "--nnodes", "2", "--node-rank", "0",
                                         "--master-port", std::to_string(testing::free_port()), "--nproc-per-node",
                                         "2", "--", testing::lockstep_binary(), "train", good, "--work-dir",
                                         work(d, "ws"), "--set", ddp};
       },
       [&](const auto&) {
         return std::vector<std::string>{"rendezvous of group 'world' timed out after 3s: 2 of 4 ranks arrived; "
                                         "missing ranks [2, 3]; check that the world size (4) matches the number of "
                                         "workers started",
                                         "lockstep run: worker rank"};
       },
       {"LOCKSTEP_TIMEOUT_S=3"}},
  };

  std::string malformed_output;
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.name);
    auto argv = bad.command(dir);
    auto result = testing::run_command(argv, bad.env, 60);
    if (bad.name == "malformed_yaml") malformed_output = result.output;
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_LT(result.exit_code, 124) << "killed by a signal or timed out:\n" << result.output;
    for (const auto& part : bad.expected(dir)) EXPECT_TRUE(contains(result.output, part)) << part << "\n" << result.output;
    for (const char* crash : {"core dumped", "Segmentation fault", "terminate called", "Aborted", "what():"}) {
      EXPECT_FALSE(contains(result.output, crash)) << crash << "\n" << result.output;
    }
  }
  // Malformed YAML: the parser's position in the file, as file:line:column
  // (in the output of that case's run above).
  EXPECT_TRUE(std::regex_search(malformed_output, std::regex("malformed\\.yaml:[0-9]+:[0-9]+: ")))
      << malformed_output;
}

}  // namespace
}  // namespace lockstep
