#include "lockstep/data/data_loader.h"

#include <map>

#include "lockstep/compat/cuda.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/rng.h"
#include "lockstep/data/batch_pipeline.h"

namespace lockstep {
namespace {

// The sampler's epochs, computed once each: a shuffled epoch costs a randperm
// of the whole dataset, far too much to repeat per batch. Keeps the two most
// recent, which is all a stream needs (a batch straddles at most two epochs
// when batch_size <= num_samples, and walks forward otherwise).
class EpochCache {
 public:
  explicit EpochCache(std::shared_ptr<const Sampler> sampler) : sampler_(std::move(sampler)) {}

  const std::vector<int64_t>& get(int64_t epoch) {
    auto found = epochs_.find(epoch);
    if (found != epochs_.end()) return found->second;
    std::vector<int64_t> indices = sampler_->epoch_indices(epoch);
    LOCKSTEP_CHECK(static_cast<int64_t>(indices.size()) == sampler_->num_samples(), "the sampler gave ",
                   indices.size(), " indices for epoch ", epoch, " but its num_samples() is ",
                   sampler_->num_samples());
    if (epochs_.size() >= 2) epochs_.erase(epochs_.begin());
    return epochs_.emplace(epoch, std::move(indices)).first->second;
  }

 private:
  std::shared_ptr<const Sampler> sampler_;
  std::map<int64_t, std::vector<int64_t>> epochs_;
};

}  // namespace

uint64_t batch_seed(uint64_t seed, int64_t epoch, int64_t batch_in_epoch) {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch)) ^
                    static_cast<uint64_t>(batch_in_epoch));
}

uint64_t epoch_seed(uint64_t seed, int64_t epoch) { return batch_seed(seed, epoch, -1); }

namespace {

// The seed get_batch receives, by the dataset's scope.
uint64_t seed_for(SeedScope scope, uint64_t seed, int64_t epoch, int64_t batch_in_epoch) {
  return scope == SeedScope::kEpoch ? epoch_seed(seed, epoch) : batch_seed(seed, epoch, batch_in_epoch);
}

void log_skipped(int64_t epoch, int64_t skipped, int64_t samples) {
  if (skipped > 0) {
    logger().warn("data loader: epoch {}: skipped {} of {} samples that could not be read (on_bad_sample: skip)",
                  epoch, skipped, samples);
  }
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler,
                       DataLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  LOCKSTEP_CHECK(dataset_ != nullptr, "DataLoader: no dataset");
  LOCKSTEP_CHECK(sampler_ != nullptr, "DataLoader: no sampler");
  LOCKSTEP_CHECK(options_.batch_size() > 0, "DataLoader: batch_size must be positive, got ", options_.batch_size());
  LOCKSTEP_CHECK(options_.num_workers() >= 0, "DataLoader: num_workers must be non-negative, got ",
                 options_.num_workers());
  LOCKSTEP_CHECK(options_.prefetch() >= 1, "DataLoader: prefetch must be at least 1, got ", options_.prefetch());
  if (options_.pin_memory() && !compat::can_pin_memory()) {
    logger().warn("data loader: pin_memory is set, but {}: batches stay in pageable memory",
                  compat::built_with_cuda() ? "no GPU is visible" : "this libtorch has no CUDA");
    options_.pin_memory(false);
  }
  const int64_t samples = sampler_->num_samples();
  const int64_t batch = options_.batch_size();
  if (sampler_->infinite()) {
    batches_per_epoch_ = samples > 0 ? std::max<int64_t>(1, samples / batch) : 0;
  } else {
    batches_per_epoch_ = options_.drop_last() ? samples / batch : (samples + batch - 1) / batch;
  }
}

DataLoader::~DataLoader() = default;

int64_t DataLoader::epoch() const { return batches_per_epoch_ > 0 ? position_ / batches_per_epoch_ : 0; }

int64_t DataLoader::batch_in_epoch() const { return batches_per_epoch_ > 0 ? position_ % batches_per_epoch_ : 0; }

Batch DataLoader::next() {
  if (!pipeline_) {
    const int64_t samples = sampler_->num_samples();
    LOCKSTEP_CHECK(batches_per_epoch_ > 0, "data loader: no batches to give: the sampler gives this rank ", samples,
                   " samples per epoch",
                   samples > 0 ? str_cat(", fewer than batch_size ", options_.batch_size(), " with drop_last") : "");
    auto cache = std::make_shared<EpochCache>(sampler_);
    detail::BatchPipeline::TaskSource source;
    const int64_t start = position_, per_epoch = batches_per_epoch_, batch = options_.batch_size();
    const uint64_t seed = options_.seed();
    const SeedScope scope = dataset_->seed_scope();
    if (!sampler_->infinite()) {
      source = [=](int64_t sequence, detail::BatchTask& task) {
        const int64_t global = start + sequence;
        task.epoch = global / per_epoch;
        task.batch_in_epoch = global % per_epoch;
        task.seed = seed_for(scope, seed, task.epoch, task.batch_in_epoch);
        const std::vector<int64_t>& indices = cache->get(task.epoch);
        const int64_t begin = task.batch_in_epoch * batch;
        const int64_t end = std::min<int64_t>(begin + batch, static_cast<int64_t>(indices.size()));
        task.indices.assign(indices.begin() + begin, indices.begin() + end);
        return true;
      };
    } else {
      // Batch g holds entries [g * batch, (g + 1) * batch) of the sampler's
      // epochs laid end to end.
      source = [=](int64_t sequence, detail::BatchTask& task) {
        const int64_t global = start + sequence;
        task.epoch = global / per_epoch;
        task.batch_in_epoch = global % per_epoch;
        task.seed = seed_for(scope, seed, task.epoch, task.batch_in_epoch);
        task.indices.resize(batch);
        for (int64_t i = 0; i < batch; ++i) {
          const int64_t entry = global * batch + i;
          task.indices[i] = cache->get(entry / samples)[entry % samples];
        }
        return true;
      };
    }
    pipeline_ = std::make_unique<detail::BatchPipeline>(
        dataset_, std::move(source), options_.num_workers(),
        options_.prefetch() * std::max(1, options_.num_workers()), options_.pin_memory());
  }
  const int64_t epoch = this->epoch(), batch_in_epoch = this->batch_in_epoch();
  ++position_;  // also past a batch that fails: the stream goes on after it
  std::optional<Batch> batch = pipeline_->next();
  LOCKSTEP_CHECK(batch.has_value(), "data loader: the stream ended unexpectedly");
  // The rows a batch should have, to count what the dataset skipped.
  const int64_t samples = sampler_->num_samples(), size = options_.batch_size();
  const int64_t expected =
      sampler_->infinite() ? size : std::min(size, samples - batch_in_epoch * size);
  if (batch->size() < expected) {
    skipped_total_ += expected - batch->size();
    skipped_in_epoch_ += expected - batch->size();
  }
  if (batch_in_epoch == batches_per_epoch_ - 1) {
    log_skipped(epoch, skipped_in_epoch_, sampler_->infinite() ? batches_per_epoch_ * size : samples);
    skipped_in_epoch_ = 0;
  }
  return std::move(*batch);
}

void DataLoader::seek(int64_t epoch, int64_t batch_in_epoch) {
  LOCKSTEP_CHECK(epoch >= 0, "data loader: cannot seek to epoch ", epoch);
  LOCKSTEP_CHECK(batch_in_epoch >= 0 && batch_in_epoch < std::max<int64_t>(batches_per_epoch_, 1),
                 "data loader: cannot seek to batch ", batch_in_epoch, " of epoch ", epoch, "; an epoch has ",
                 batches_per_epoch_, " batches (0..", batches_per_epoch_ - 1, ")");
  pipeline_.reset();
  position_ = epoch * batches_per_epoch_ + batch_in_epoch;
  skipped_in_epoch_ = 0;
}

void DataLoader::for_each_batch(int64_t epoch, const std::function<void(const Batch&)>& visit) const {
  LOCKSTEP_CHECK(epoch >= 0, "data loader: cannot go over epoch ", epoch);
  auto indices = std::make_shared<const std::vector<int64_t>>(EpochCache(sampler_).get(epoch));
  const int64_t total = static_cast<int64_t>(indices->size()), batch = options_.batch_size();
  const int64_t count = options_.drop_last() ? total / batch : (total + batch - 1) / batch;
  const uint64_t seed = options_.seed();
  const SeedScope scope = dataset_->seed_scope();
  detail::BatchPipeline pipeline(
      dataset_,
      [=](int64_t sequence, detail::BatchTask& task) {
        if (sequence >= count) return false;
        task.epoch = epoch;
        task.batch_in_epoch = sequence;
        task.seed = seed_for(scope, seed, epoch, sequence);
        const int64_t begin = sequence * batch;
        task.indices.assign(indices->begin() + begin, indices->begin() + std::min(begin + batch, total));
        return true;
      },
      options_.num_workers(), options_.prefetch() * std::max(1, options_.num_workers()), options_.pin_memory());
  int64_t delivered = 0;
  while (std::optional<Batch> next = pipeline.next()) {
    delivered += next->size();
    visit(*next);
  }
  log_skipped(epoch, std::min(count * batch, total) - delivered, total);
}

State DataLoader::state() const {
  State state;
  state.values["epoch"] = epoch();
  state.values["batch_in_epoch"] = batch_in_epoch();
  state.values["batches_per_epoch"] = batches_per_epoch_;
  return state;
}

void DataLoader::load_state(const State& state) {
  const auto& values = state.values;
  for (const char* key : {"epoch", "batch_in_epoch"}) {
    LOCKSTEP_CHECK(values.is_object() && values.contains(key) && values[key].is_number_integer(),
                   "data loader state: missing integer '", key, "' (got ", values.dump(), ")");
  }
  if (values.contains("batches_per_epoch")) {
    const auto saved = values["batches_per_epoch"].get<int64_t>();
    LOCKSTEP_CHECK(saved == batches_per_epoch_, "data loader state: saved with ", saved,
                   " batches per epoch, but this loader has ", batches_per_epoch_,
                   " (batch_size, dataset, sampler or world size changed), so the saved position would name "
                   "different data");
  }
  seek(values["epoch"].get<int64_t>(), values["batch_in_epoch"].get<int64_t>());
}

std::unique_ptr<DataLoader> build_data_loader(const Config& cfg, const SamplerContext& ctx) {
  LOCKSTEP_CHECK(cfg.is_map(), cfg.where(),
                 ": a data loader is configured as a map with batch_size, sampler and dataset");
  DataLoaderOptions options;
  options.batch_size(cfg.get<int64_t>("batch_size"));
  LOCKSTEP_CHECK(options.batch_size() > 0, cfg.where("batch_size"), ": batch_size must be positive, got ",
                 options.batch_size());
  options.num_workers(cfg.get<int>("num_workers", 0));
  LOCKSTEP_CHECK(options.num_workers() >= 0, cfg.where("num_workers"), ": num_workers must be non-negative, got ",
                 options.num_workers());
  options.prefetch(cfg.get<int>("prefetch_factor", 2));
  LOCKSTEP_CHECK(options.prefetch() >= 1, cfg.where("prefetch_factor"), ": prefetch_factor must be at least 1, got ",
                 options.prefetch());
  options.drop_last(cfg.get<bool>("drop_last", false));
  options.pin_memory(cfg.get<bool>("pin_memory", false));
  // Mixing in the rank keeps ranks from applying the same random draws to
  // their (different) examples.
  options.seed(batch_seed(ctx.seed, ctx.rank, -1));
  std::shared_ptr<Dataset> dataset = dataset_registry().build(cfg.at("dataset"));
  std::shared_ptr<Sampler> sampler = sampler_registry().build(cfg.at("sampler"), dataset->size(), ctx);
  cfg.check_all_used("data loader");
  return std::make_unique<DataLoader>(std::move(dataset), std::move(sampler), options);
}

}  // namespace lockstep
