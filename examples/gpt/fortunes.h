// Character-level text from the Debian `fortunes` corpus, for the GPT example.
//
// /usr/share/games/fortunes holds plain text files whose entries are
// separated by lines holding a single '%'. Every such file is read (sorted by
// name; the .dat indexes and .u8 links are skipped), cleaned to 96 tokens
// ('\n' and printable ASCII; backspace overstrikes resolved, tabs as spaces,
// other bytes dropped), and split by entry: every `val_every`-th fortune is
// held out for validation. Each split is its fortunes joined by "\n%\n" (the
// model learns where a fortune ends).
//
//   gpt::register_components();   // model "GPT", dataset "FortuneChars", metric "CharCrossEntropy"
//   train_dataloader:
//     dataset: {type: FortuneChars, root: /usr/share/games/fortunes, split: train, block_size: 64}
//   val_evaluator: {type: CharCrossEntropy}
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "examples/gpt/gpt_model.h"
#include "lockstep/core/error.h"
#include "lockstep/data/dataset.h"
#include "lockstep/evaluation/metric.h"
#include "lockstep/model/model.h"

namespace gpt {

// '\n' is token 0, ' '..'~' are tokens 1..95.
constexpr int64_t kVocabSize = 96;

inline int64_t char_token(unsigned char c) {
  if (c == '\n') return 0;
  if (c >= 32 && c <= 126) return c - 31;
  return -1;
}

inline char token_char(int64_t token) { return token == 0 ? '\n' : static_cast<char>(token + 31); }

inline std::string decode(const torch::Tensor& tokens) {
  std::string text;
  auto flat = tokens.to(torch::kCPU).to(torch::kLong).reshape(-1);
  for (int64_t i = 0; i < flat.numel(); ++i) text += token_char(flat[i].item<int64_t>());
  return text;
}

inline torch::Tensor encode(const std::string& text) {
  std::vector<int64_t> ids;
  for (unsigned char c : text) {
    const int64_t token = char_token(c);
    if (token >= 0) ids.push_back(token);
  }
  return torch::tensor(ids, torch::kLong);
}

// One fortune as tokenisable text: an overstrike ("_\bX", "X\bX") keeps the
// last character, tabs become spaces, anything else outside the vocabulary goes.
inline std::string clean(const std::string& raw) {
  std::string text;
  for (unsigned char c : raw) {
    if (c == '\b') {
      if (!text.empty()) text.pop_back();
    } else if (c == '\t') {
      text += ' ';
    } else if (char_token(c) >= 0) {
      text += static_cast<char>(c);
    }
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  while (!text.empty() && text.front() == '\n') text.erase(text.begin());
  return text;
}

// Every fortune under `root`, in file-name order.
inline std::vector<std::string> load_fortunes(const std::string& root) {
  namespace fs = std::filesystem;
  LOCKSTEP_CHECK(fs::is_directory(root), "FortuneChars: ", root,
                 " is not a directory (install the Debian package fortunes, or set dataset.root)");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_regular_file() && !entry.is_symlink() && !entry.path().has_extension()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> fortunes;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::string line, current;
    auto flush = [&] {
      std::string text = clean(current);
      if (!text.empty()) fortunes.push_back(std::move(text));
      current.clear();
    };
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line == "%") {
        flush();
      } else {
        current += line + "\n";
      }
    }
    flush();
  }
  LOCKSTEP_CHECK(!fortunes.empty(), "FortuneChars: no fortunes found in ", root);
  return fortunes;
}

// "train": every fortune but each `val_every`-th; "val": those.
inline std::string split_text(const std::vector<std::string>& fortunes, const std::string& split, int64_t val_every) {
  LOCKSTEP_CHECK(split == "train" || split == "val", "FortuneChars: split must be train or val, got '", split, "'");
  LOCKSTEP_CHECK(val_every >= 2, "FortuneChars: val_every must be at least 2, got ", val_every);
  std::string text;
  for (size_t i = 0; i < fortunes.size(); ++i) {
    const bool held_out = static_cast<int64_t>(i) % val_every == val_every - 1;
    if (held_out != (split == "val")) continue;
    text += fortunes[i] + "\n%\n";
  }
  return text;
}

// -sum p log p of the token frequencies, in nats: the loss of the best model
// that ignores context, the bar a language model must get well below.
inline double unigram_entropy(const torch::Tensor& tokens) {
  torch::Tensor p = torch::bincount(tokens.reshape(-1), {}, kVocabSize).to(torch::kDouble);
  p = p / p.sum();
  p = p.masked_select(p > 0);
  return -(p * p.log()).sum().item<double>();
}

// Windows of block_size + 1 tokens: example i starts at i * block_size plus
// a per-batch offset (from the batch seed), so epochs see shifted windows.
class FortuneChars : public lockstep::Dataset {
 public:
  FortuneChars(const std::string& root, const std::string& split, int64_t block_size, int64_t val_every)
      : block_size_(block_size), random_offset_(split == "train") {
    LOCKSTEP_CHECK(block_size_ >= 1, "FortuneChars: block_size must be positive, got ", block_size_);
    tokens_ = encode(split_text(load_fortunes(root), split, val_every));
    LOCKSTEP_CHECK(tokens_.numel() > 2 * block_size_ + 1, "FortuneChars: the ", split, " split has only ",
                   tokens_.numel(), " characters");
  }

  int64_t size() const override { return (tokens_.numel() - 1) / block_size_ - 1; }

  lockstep::Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override {
    const int64_t offset = random_offset_ ? static_cast<int64_t>(seed % static_cast<uint64_t>(block_size_)) : 0;
    std::vector<torch::Tensor> windows;
    for (int64_t index : indices) windows.push_back(tokens_.narrow(0, index * block_size_ + offset, block_size_ + 1));
    torch::Tensor batch = torch::stack(windows);
    return lockstep::Batch{{"input", batch.narrow(1, 0, block_size_).contiguous()},
                           {"target", batch.narrow(1, 1, block_size_).contiguous()}};
  }

  const torch::Tensor& tokens() const { return tokens_; }

 private:
  torch::Tensor tokens_;
  int64_t block_size_;
  bool random_offset_;
};

// Mean cross-entropy per character (nats) of predictions["logits"] against
// data["target"], and bits per character.
class CharCrossEntropy : public lockstep::Metric {
 public:
  CharCrossEntropy() : lockstep::Metric("val") {}
  void process(const lockstep::Batch& data, const lockstep::Batch& predictions) override {
    torch::Tensor logits = predictions.at("logits").to(torch::kFloat);
    torch::Tensor nll = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), data.at("target").reshape(-1).to(logits.device()),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    nll = nll.reshape({logits.size(0), -1}).sum(1).to(torch::kCPU);
    for (int64_t i = 0; i < nll.size(0); ++i) add_result({{"nll", nll[i].item<double>()}, {"chars", logits.size(1)}});
  }
  std::map<std::string, double> compute(const std::vector<nlohmann::json>& results) const override {
    double nll = 0, chars = 0;
    for (const auto& record : results) {
      nll += record.at("nll").get<double>();
      chars += record.at("chars").get<double>();
    }
    const double loss = chars > 0 ? nll / chars : NAN;
    return {{"loss", loss}, {"bits_per_char", loss / std::log(2.0)}};
  }
};

inline void register_components() {
  static const bool registered = [] {
    lockstep::model_registry().add("GPT", [](const lockstep::Config& config) {
      return std::make_shared<GPT>(GPTOptions()
                                       .vocab_size(config.get<int64_t>("vocab_size", kVocabSize))
                                       .block_size(config.get<int64_t>("block_size", 64))
                                       .n_layer(config.get<int64_t>("n_layer", 4))
                                       .n_head(config.get<int64_t>("n_head", 4))
                                       .n_embd(config.get<int64_t>("n_embd", 128))
                                       .dropout(config.get<double>("dropout", 0.0))
                                       .lora_rank(config.get<int64_t>("lora_rank", 0))
                                       .lora_alpha(config.get<double>("lora_alpha", 16.0)));
    });
    lockstep::dataset_registry().add("FortuneChars", [](const lockstep::Config& config) {
      return std::make_shared<FortuneChars>(config.get<std::string>("root", "/usr/share/games/fortunes"),
                                            config.get<std::string>("split", "train"),
                                            config.get<int64_t>("block_size", 64), config.get<int64_t>("val_every", 20));
    });
    lockstep::metric_registry().add("CharCrossEntropy",
                                    [](const lockstep::Config&) { return std::make_shared<CharCrossEntropy>(); });
    return true;
  }();
  (void)registered;
}

}  // namespace gpt
