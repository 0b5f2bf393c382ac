// `lockstep plot`: training curves from runs' metrics.jsonl as one SVG file, a
// panel per key and a curve per run (mmengine's `analyze_logs.py plot_curve`,
// with no Python or TensorBoard).
//
//   $ lockstep plot work_dirs/a work_dirs/b --keys loss,accuracy/top1 -o curves.svg
//   Wrote curves.svg (2 keys, 2 runs)
//   $ lockstep plot work_dirs/a --x epoch --smooth 10 --png --title "ResNet-18"   # also curves.png (rsvg-convert)
//
// The CLI's main registers it next to train, run and ckpt:
//
//   CLI::App app{"lockstep"};
//   lockstep::cli::add_plot_command(app);
#pragma once

#include <CLI/CLI.hpp>

namespace lockstep::cli {

CLI::App* add_plot_command(CLI::App& app);

}  // namespace lockstep::cli
