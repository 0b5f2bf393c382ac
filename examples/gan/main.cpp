// A DCGAN on Fashion-MNIST, trained by lockstep from gan.yaml: two networks,
// two optimizers (one per network, each with its own schedulers), separate
// DDP when launched on several processes, and a PNG grid of samples in the
// work dir every N iterations.
//
//   build/bin/lockstep run --standalone --nproc-per-node 2 -- build/examples/gan examples/gan/gan.yaml
//   build/examples/gan examples/gan/gan.yaml --set strategy=null      # one process
//
// The model, the noise-carrying dataset and the sample hook are in dcgan.h.
#include <iostream>

#include "examples/gan/dcgan.h"
#include "lockstep/config/config.h"
#include "lockstep/runner/runner.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " CONFIG [--set key=value]... [--work-dir DIR] [--resume]\n";
    return 2;
  }
  try {
    dcgan::register_components();
    lockstep::Config config = lockstep::Config::load_file(argv[1]);
    lockstep::RunnerOptions options;
    for (int i = 2; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--resume") {
        options.resume(true);
      } else if ((flag == "--set" || flag == "--work-dir") && i + 1 < argc) {
        if (flag == "--set") {
          config.apply_override(argv[++i]);
        } else {
          options.work_dir(argv[++i]);
        }
      } else {
        std::cerr << "unknown or incomplete option " << flag << "\n";
        return 2;
      }
    }
    lockstep::Runner runner(config, options);
    runner.train();
    if (runner.strategy().is_main_process()) {
      auto& storage = runner.trainer().storage();
      std::cout << "GAN trained " << runner.trainer().iter() << " iterations; last loss_d "
                << storage.history("loss_d").latest() << ", loss_g " << storage.history("loss_g").latest()
                << "; samples in " << runner.work_dir() << "\n";
    }
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "gan: error: " << error.what() << "\n";
    return 1;
  }
}
