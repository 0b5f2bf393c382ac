// `lockstep train CONFIG [--work-dir D] [--resume] [--load-from F] [--set k=v]... [--nproc N]`
#pragma once

#include <CLI/CLI.hpp>

namespace lockstep::cli {

void add_train_command(CLI::App& app);

}  // namespace lockstep::cli
