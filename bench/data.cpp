// bench/data: lockstep's image loader against torchvision's, images per second.
//
// The data: 512 x 512 RGB JPEGs (quality 90, 4:2:0) made from Fashion-MNIST
// by bench/make_image_folder.py, in class folders, cached in
// $LOCKSTEP_BENCH_DATA (default /var/tmp/lockstep-bench-images). The work:
// read and decode each file, RandomResizedCrop(224), RandomHorizontalFlip,
// batches of 64 uint8 [64, 3, 224, 224], shuffled. For 1 and 2 workers it
// measures, alternating in rounds so that all see the same machine:
//   lockstep      - ImageFolder + DataLoader (worker threads), at::set_num_threads(1),
//                   JPEGs decoded at 1/2, 1/4 or 1/8 scale where the resize allows
//                   (dct_scaling: true, the default, as Pillow's draft())
//   no-dct        - the same with dct_scaling: false: full-scale decodes, the
//                   pixels torchvision gives (for information)
//   torchvision   - torchvision 0.14's ImageFolder + torch's DataLoader (worker
//                   processes, PIL), bench/data_torchvision.py, the same transforms
//                   with PILToTensor, one torch thread
// Each times BENCH_BATCHES batches after BENCH_WARMUP warm-up batches (which
// cover starting the workers); the data set holds at least that many images,
// so neither loader crosses an epoch boundary while timed. It prints the
// rates (median over rounds), the ratios lockstep / torchvision (median over
// rounds of the ratio within a round; target >= 2.0 at each worker count) and
//   ratio data_w1_vs_torchvision VALUE
//   ratio data_w2_vs_torchvision VALUE
//
//   build/bench/bench_data                    # BENCH_ROUNDS=5 BENCH_BATCHES=40 BENCH_WARMUP=5
//   build/bench/bench_data lockstep 2 [full]  # lockstep's loader alone (for perf), [full]: dct_scaling false
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <sstream>

#include "bench/bench_util.h"
#include "lockstep/config/config.h"
#include "lockstep/core/logging.h"
#include "lockstep/data/data_loader.h"
#include "lockstep/data/image/image_dataset.h"
#include "lockstep/data/sampler.h"
#include "tests/support/test_support.h"

using namespace lockstep;

namespace {

constexpr int64_t kBatch = 64;
constexpr int kClasses = 10;
const std::vector<int> kWorkerCounts = {1, 2};

std::shared_ptr<const ImageFolder> make_dataset(const std::string& root, bool dct_scaling) {
  ImageDatasetOptions options;
  options.mode = ColorMode::kRGB;
  options.pipeline = ImagePipeline::build(parse_config("- {type: RandomResizedCrop, size: 224}\n"
                                                        "- {type: RandomHorizontalFlip}\n"));
  options.dct_scaling = dct_scaling;
  return std::make_shared<const ImageFolder>(root, options);
}

// Images per second of lockstep's loader: `batches` batches after `warmup`.
double lockstep_rate(const std::shared_ptr<const ImageFolder>& dataset, int workers, int batches, int warmup,
                     uint64_t seed) {
  auto sampler = std::make_shared<DefaultSampler>(dataset->size(), /*shuffle=*/true, seed);
  DataLoader loader(dataset, sampler, DataLoaderOptions().batch_size(kBatch).num_workers(workers).seed(seed));
  for (int i = 0; i < warmup; ++i) loader.next();
  int64_t images = 0;
  const double start = bench::now_seconds();
  for (int i = 0; i < batches; ++i) {
    Batch batch = loader.next();
    const torch::Tensor& image = batch.at("image");
    LOCKSTEP_CHECK(image.scalar_type() == torch::kUInt8 && image.dim() == 4 && image.size(1) == 3 &&
                       image.size(2) == 224 && image.size(3) == 224,
                   "bench_data: unexpected batch ", image.sizes());
    images += image.size(0);
  }
  return static_cast<double>(images) / (bench::now_seconds() - start);
}

double torchvision_rate(const std::string& root, int workers, int batches, int warmup, uint64_t seed) {
  auto result = testing::run_command({"/usr/bin/python3", testing::source_dir() + "/bench/data_torchvision.py", root,
                                      "--workers", std::to_string(workers), "--batches", std::to_string(batches),
                                      "--warmup", std::to_string(warmup), "--batch-size", std::to_string(kBatch),
                                      "--seed", std::to_string(seed)},
                                     {"OMP_NUM_THREADS=1"}, 600);
  std::istringstream lines(result.output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("RESULT torchvision ", 0) != 0) continue;
    std::istringstream fields(line.substr(19));
    int w = 0;
    double rate = 0;
    if (fields >> w >> rate) return rate;
  }
  LOCKSTEP_FAIL("bench_data: bench/data_torchvision.py gave no result (exit ", result.exit_code, "):\n",
                result.output);
}

std::string make_data(int per_class) {
  const char* env = std::getenv("LOCKSTEP_BENCH_DATA");
  const std::string base = env != nullptr && *env != '\0' ? env : "/var/tmp/lockstep-bench-images";
  const std::string root = base + "/fashion-mnist-512-q90-" + std::to_string(per_class * kClasses);
  auto result = testing::run_command({"/usr/bin/python3", testing::source_dir() + "/bench/make_image_folder.py", root,
                                      "--per-class", std::to_string(per_class)},
                                     {}, 600);
  LOCKSTEP_CHECK(result.exit_code == 0, "bench_data: bench/make_image_folder.py failed (exit ", result.exit_code,
                 "):\n", result.output);
  std::printf("%s", result.output.c_str());
  return root;
}

int driver() {
  const int rounds = static_cast<int>(bench::env_int("BENCH_ROUNDS", 5));
  const int batches = static_cast<int>(bench::env_int("BENCH_BATCHES", 40));
  const int warmup = static_cast<int>(bench::env_int("BENCH_WARMUP", 5));
  LOCKSTEP_CHECK(rounds > 0 && batches > 0 && warmup >= 0, "bench_data: BENCH_ROUNDS and BENCH_BATCHES must be > 0, BENCH_WARMUP >= 0");
  at::set_num_threads(1);
  logger().set_level(spdlog::level::warn);

  // Enough images for warm-up and timed batches in one epoch, 100 per class at least.
  const int per_class = std::max<int>(100, static_cast<int>(((batches + warmup) * kBatch + kClasses - 1) / kClasses));
  const std::string root = make_data(per_class);
  const bool have_torchvision = testing::python_has("torchvision");
  if (!have_torchvision) std::printf("torchvision: not importable by /usr/bin/python3; its column stays empty\n");

  const auto scaled = make_dataset(root, /*dct_scaling=*/true);
  const auto full = make_dataset(root, /*dct_scaling=*/false);
  std::printf("bench/data: %lld images 512x512 JPEG q90 in %zu classes; decode, RandomResizedCrop(224), "
              "RandomHorizontalFlip, batch %lld, uint8; %d rounds x (%d warm-up + %d timed batches)\n",
              static_cast<long long>(scaled->size()), scaled->classes().size(), static_cast<long long>(kBatch), rounds,
              warmup, batches);

  std::map<int, std::map<std::string, std::vector<double>>> rates;  // workers -> loader -> per round
  for (int round = 0; round < rounds; ++round) {
    for (int workers : kWorkerCounts) {
      const uint64_t seed = static_cast<uint64_t>(round);
      auto& r = rates[workers];
      auto run_lockstep = [&] {
        r["lockstep"].push_back(lockstep_rate(scaled, workers, batches, warmup, seed));
        r["no-dct"].push_back(lockstep_rate(full, workers, batches, warmup, seed));
      };
      auto run_torchvision = [&] {
        if (have_torchvision) r["torchvision"].push_back(torchvision_rate(root, workers, batches, warmup, seed));
      };
      bench::in_alternating_order(round, run_lockstep, run_torchvision);
      std::printf("  round %d, %d worker(s):", round, workers);
      for (auto& [loader, values] : r) std::printf("  %s %.1f img/s", loader.c_str(), values.back());
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  // Ratios pair the runs of one round and take the median over rounds.
  auto paired = [&](int workers, const std::string& name) {
    auto& r = rates[workers];
    std::vector<double> ratios;
    for (size_t i = 0; i < r[name].size() && i < r["torchvision"].size(); ++i) {
      ratios.push_back(r[name][i] / r["torchvision"][i]);
    }
    return bench::median(ratios);
  };
  std::printf("\n| workers | lockstep | lockstep, dct_scaling: false | torchvision | lockstep / torchvision | "
              "no-DCT / torchvision |\n|---|---|---|---|---|---|\n");
  for (int workers : kWorkerCounts) {
    auto& r = rates[workers];
    if (have_torchvision) {
      std::printf("| %d | %.1f img/s | %.1f img/s | %.1f img/s | %.3f | %.3f |\n", workers,
                  bench::median(r["lockstep"]), bench::median(r["no-dct"]), bench::median(r["torchvision"]),
                  paired(workers, "lockstep"), paired(workers, "no-dct"));
    } else {
      std::printf("| %d | %.1f img/s | %.1f img/s | n/a | n/a | n/a |\n", workers, bench::median(r["lockstep"]),
                  bench::median(r["no-dct"]));
    }
  }
  std::printf("rates: medians over rounds; ratios: median over rounds of the ratio within a round\n");
  std::printf("target: lockstep / torchvision >= 2.0 at each worker count\n");
  if (have_torchvision) {
    for (int workers : kWorkerCounts) {
      std::printf("ratio data_w%d_vs_torchvision %.3f\n", workers, paired(workers, "lockstep"));
    }
  }
  return 0;
}

// One loader alone, for profiling: bench_data lockstep WORKERS [full] [ROOT].
int profile(int workers, bool dct_scaling, const std::string& root_arg) {
  const int batches = static_cast<int>(bench::env_int("BENCH_BATCHES", 40));
  const int warmup = static_cast<int>(bench::env_int("BENCH_WARMUP", 5));
  at::set_num_threads(1);
  logger().set_level(spdlog::level::warn);
  const int per_class = std::max<int>(100, static_cast<int>(((batches + warmup) * kBatch + kClasses - 1) / kClasses));
  const std::string root = root_arg.empty() ? make_data(per_class) : root_arg;
  std::printf("RESULT lockstep%s %d %.3f\n", dct_scaling ? "" : "-no-dct", workers,
              lockstep_rate(make_dataset(root, dct_scaling), workers, batches, warmup, 0));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 3 && std::string(argv[1]) == "lockstep") {
      return profile(std::stoi(argv[2]), !(argc >= 4 && std::string(argv[3]) == "full"), argc >= 5 ? argv[4] : "");
    }
    return driver();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_data: %s\n", error.what());
    return 1;
  }
}
