// A character-level GPT trained on the Debian `fortunes` corpus with FSDP,
// from examples/gpt/gpt_fsdp.yaml: the program registers its model, dataset
// and metric (fortunes.h), prints the unigram entropy of the text (the loss
// of the best model without context), trains through lockstep's Runner,
// compares the held-out loss with that entropy, and prints a sample.
//
//   build/bin/lockstep run --standalone --nproc-per-node 2 -- build/examples/gpt_fortunes examples/gpt/gpt_fsdp.yaml
//   build/examples/gpt_fortunes examples/gpt/gpt_fsdp.yaml --set strategy=null     # one process, no FSDP
//
// Options: --set key=value (any config key), --work-dir DIR, --resume,
// --sample-chars N (default 400).
#include <cmath>
#include <iostream>

#include "examples/gpt/fortunes.h"
#include "lockstep/config/config.h"
#include "lockstep/runner/command_line.h"
#include "lockstep/runner/runner.h"
#include "lockstep/strategy/fsdp_strategy.h"

namespace {

int64_t parameter_count(lockstep::Strategy& strategy) {
  int64_t count = 0;
  if (auto* fsdp = dynamic_cast<lockstep::FSDPStrategy*>(&strategy)) {
    for (const auto& unit : fsdp->fsdp()->units()) count += unit->layout().numel;  // parameters are sharded
    return count;
  }
  for (const auto& p : strategy.model()->parameters()) count += p.numel();
  return count;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    gpt::register_components();
    auto command = lockstep::parse_command_line(argc, argv, {"--sample-chars"});
    if (!command) return 2;
    const lockstep::Config& config = command->config;
    const int64_t sample_chars = std::stoll(command->flag("--sample-chars", "400"));
    lockstep::Runner runner(config, command->options);
    const bool main_process = runner.strategy().collectives()->is_main_process();

    auto train_data = std::dynamic_pointer_cast<gpt::FortuneChars>(
        lockstep::dataset_registry().build(config.at("train_dataloader").at("dataset")));
    LOCKSTEP_CHECK(train_data != nullptr, config.where("train_dataloader.dataset"), ": the GPT example trains on FortuneChars");
    const double entropy = gpt::unigram_entropy(train_data->tokens());
    if (main_process) {
      std::cout << "corpus: " << train_data->tokens().numel() << " training characters; unigram entropy " << entropy
                << " nats/char (" << entropy / std::log(2.0) << " bits)" << std::endl;
    }

    auto val_metrics = runner.train();

    auto model = std::dynamic_pointer_cast<gpt::GPT>(runner.strategy().model());
    LOCKSTEP_CHECK(model != nullptr, config.where("model"), ": the GPT example needs model type GPT");
    const auto& loss = runner.trainer().storage().history("loss");
    const double final_train = loss.median(20);
    // Every rank generates (FSDP gathers each block collectively), with the same seed.
    torch::Tensor sample = model->generate(gpt::encode("%\n"), sample_chars, /*temperature=*/0.8, /*seed=*/1234);
    if (main_process) {
      std::cout << "parameters: " << parameter_count(runner.strategy()) << "; iterations: " << runner.trainer().iter()
                << "\nfinal train loss (median of the last iterations): " << final_train << " nats/char";
      if (val_metrics.count("val/loss")) {
        std::cout << "\nheld-out loss: " << val_metrics["val/loss"] << " nats/char ("
                  << val_metrics["val/bits_per_char"] << " bits)";
      }
      std::cout << "\nunigram entropy: " << entropy << " nats/char; final train loss / entropy = "
                << final_train / entropy << "\n--- sample ---\n"
                << gpt::decode(sample.narrow(0, 2, sample.numel() - 2)) << "\n--- end of sample ---" << std::endl;
    }
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "gpt_fortunes: error: " << error.what() << "\n";
    return 1;
  }
}
