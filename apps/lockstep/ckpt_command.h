// `lockstep ckpt`: look inside checkpoints and hand their weights to other tools.
//
//   $ lockstep ckpt inspect work_dirs/demo/model_final.ckpt          # iteration, tensors, config
//   $ lockstep ckpt inspect model.safetensors --json                  # any safetensors file, as JSON
//   $ lockstep ckpt export work_dirs/demo/model_final.ckpt --format safetensors -o model.safetensors
//
// The CLI's main registers it next to train and run:
//
//   CLI::App app{"lockstep"};
//   lockstep::cli::add_ckpt_command(app);
#pragma once

#include <CLI/CLI.hpp>

namespace lockstep::cli {

CLI::App* add_ckpt_command(CLI::App& app);

}  // namespace lockstep::cli
