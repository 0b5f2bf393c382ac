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
#include "lockstep/runner/command_line.h"
#include "lockstep/runner/runner.h"

int main(int argc, char** argv) {
  try {
    dcgan::register_components();
    auto command = lockstep::parse_command_line(argc, argv);
    if (!command) return 2;
    lockstep::Runner runner(command->config, command->options);
    runner.train();
    if (runner.strategy().collectives()->is_main_process()) {
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
