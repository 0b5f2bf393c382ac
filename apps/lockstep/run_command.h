// `lockstep run`: the launcher subcommand (torchrun's --no-python mode for
// lockstep programs). The CLI's main registers it:
//
//   CLI::App app{"lockstep"};
//   lockstep::add_run_command(app);
//   CLI11_PARSE(app, argc, argv);   // a failed job's exit code comes back via CLI::RuntimeError
//
//   $ lockstep run --standalone --nproc-per-node 2 -- ./train cfg.yaml
//   $ lockstep run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 \
//                  --nproc-per-node 8 --max-restarts 3 -- ./train cfg.yaml
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "lockstep/launch/launcher.h"

namespace lockstep {

// Adds the "run" subcommand. Its callback runs the job and, when the job
// failed, throws CLI::RuntimeError carrying the exit code.
CLI::App* add_run_command(CLI::App& app);

// Runs the job and returns its exit code, printing a launcher error (bad
// options, port in use) as "lockstep run: ..." with exit code 1.
int run_command_main(const LaunchOptions& options);

}  // namespace lockstep
