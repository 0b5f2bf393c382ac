// The `lockstep` command: train from a config, launch workers, inspect checkpoints, plot curves.
//
//   lockstep train examples/fashion_mnist/cnn.yaml --work-dir work_dirs/demo
//   lockstep run --standalone --nproc-per-node 2 -- lockstep train cnn.yaml
//   lockstep ckpt inspect work_dirs/demo/model_final.ckpt
//   lockstep plot work_dirs/demo work_dirs/other --keys loss,accuracy/top1 -o curves.svg
//   lockstep --help
#include <iostream>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "apps/lockstep/ckpt_command.h"
#include "apps/lockstep/plot_command.h"
#include "apps/lockstep/run_command.h"
#include "apps/lockstep/train_command.h"
#include "lockstep/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"lockstep: a training engine for libtorch (trainer, DDP, FSDP, launcher)"};
  app.require_subcommand(1);
  lockstep::cli::add_train_command(app);
  lockstep::add_run_command(app);
  lockstep::cli::add_ckpt_command(app);
  lockstep::cli::add_plot_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& result) {
    return result.get_exit_code();
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const lockstep::Error& error) {
    std::cerr << "lockstep: error: " << error.what() << std::endl;
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "lockstep: error: " << lockstep::short_torch_message(error) << std::endl;
    return 1;
  }
  return 0;
}
