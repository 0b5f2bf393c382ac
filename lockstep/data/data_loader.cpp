#include "lockstep/data/data_loader.h"

#include <fstream>
#include <map>
#include <mutex>

#include "lockstep/compat/cuda.h"
#include "lockstep/config/key_usage.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/rng.h"
#include "lockstep/data/internal/batch_pipeline.h"
#include "lockstep/data/dataset_subset.h"

namespace lockstep {
namespace {

// The sampler's epochs, computed once each: a shuffled epoch costs a randperm
// of the whole dataset, far too much to repeat per batch. Keeps the two most
// recent, which is all a stream needs (a batch straddles at most two epochs
// when batch_size <= num_samples, and walks forward otherwise).
// An epoch whose rest was re-sharded (DataLoader::load_state) is given as
// `replaced`: its entries before the rest are placeholders no batch reads.
class EpochCache {
 public:
  explicit EpochCache(std::shared_ptr<const Sampler> sampler,
                      std::optional<std::pair<int64_t, std::vector<int64_t>>> replaced = std::nullopt)
      : sampler_(std::move(sampler)), replaced_(std::move(replaced)) {}

  const std::vector<int64_t>& get(int64_t epoch) {
    if (replaced_ && replaced_->first == epoch) return replaced_->second;
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
  std::optional<std::pair<int64_t, std::vector<int64_t>>> replaced_;
  std::map<int64_t, std::vector<int64_t>> epochs_;
};



}  // namespace

// The indices of the batches built ahead, by stream position, until next()
// hands them out and logs them (DataLoaderOptions::index_log only).
struct DataLoader::PendingIndices {
  std::mutex mutex;
  std::map<int64_t, std::vector<int64_t>> by_position;
};

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
  LOCKSTEP_CHECK(options_.timeout() >= 0, "DataLoader: timeout must be >= 0 seconds (0 waits without limit), got ",
                 options_.timeout());
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

void DataLoader::start_pipeline() {
  const int64_t samples = sampler_->num_samples();
  LOCKSTEP_CHECK(batches_per_epoch_ > 0, "data loader: no batches to give: the sampler gives this rank ", samples,
                 " samples per epoch",
                 samples > 0 ? str_cat(", fewer than batch_size ", options_.batch_size(), " with drop_last") : "");
  std::optional<std::pair<int64_t, std::vector<int64_t>>> replaced;
  if (rest_) {
    std::vector<int64_t> entries(static_cast<size_t>(rest_->first_batch * options_.batch_size()), -1);
    entries.insert(entries.end(), rest_->indices.begin(), rest_->indices.end());
    replaced.emplace(rest_->epoch, std::move(entries));
  }
  auto cache = std::make_shared<EpochCache>(sampler_, std::move(replaced));
  if (!options_.index_log().empty()) pending_ = std::make_shared<PendingIndices>();
  auto pending = pending_;
  const int64_t start = position_, per_epoch = batches_per_epoch_, batch = options_.batch_size();
  const uint64_t seed = options_.seed();
  const SeedScope scope = dataset_->seed_scope();
  const bool infinite = sampler_->infinite();
  // The indices of batch `global`: a finite sampler's slice of its epoch; an
  // infinite sampler's entries [global * batch, (global + 1) * batch) of its
  // epochs laid end to end.
  auto indices_of = [=](int64_t global, const detail::BatchTask& task, std::vector<int64_t>& out) {
    if (!infinite) {
      const std::vector<int64_t>& indices = cache->get(task.epoch);
      const int64_t begin = task.batch_in_epoch * batch;
      const int64_t end = std::min<int64_t>(begin + batch, static_cast<int64_t>(indices.size()));
      out.assign(indices.begin() + begin, indices.begin() + end);
      return;
    }
    out.resize(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t entry = global * batch + i;
      out[static_cast<size_t>(i)] = cache->get(entry / samples)[static_cast<size_t>(entry % samples)];
    }
  };
  detail::BatchPipeline::TaskSource source = [=](int64_t sequence, detail::BatchTask& task) {
    const int64_t global = start + sequence;
    task.epoch = global / per_epoch;
    task.batch_in_epoch = global % per_epoch;
    task.seed = seed_for(scope, seed, task.epoch, task.batch_in_epoch);
    indices_of(global, task, task.indices);
    if (pending) {
      std::lock_guard<std::mutex> lock(pending->mutex);
      pending->by_position[global] = task.indices;
    }
    return true;
  };
  pipeline_ = std::make_unique<detail::BatchPipeline>(dataset_, std::move(source), options_.num_workers(),
                                                      options_.prefetch() * std::max(1, options_.num_workers()),
                                                      options_.pin_memory(), options_.timeout());
}

Batch DataLoader::next() {
  if (!pipeline_) start_pipeline();
  const int64_t epoch = this->epoch(), batch_in_epoch = this->batch_in_epoch();
  const int64_t position = position_++;  // also past a batch that fails or times out: the stream goes on after it
  std::optional<Batch> batch = pipeline_->next();
  LOCKSTEP_CHECK(batch.has_value(), "data loader: the stream ended unexpectedly");
  if (pending_) {
    std::vector<int64_t> indices;
    {
      std::lock_guard<std::mutex> lock(pending_->mutex);
      indices = std::move(pending_->by_position[position]);
      pending_->by_position.erase(position);
    }
    std::string line = str_cat("epoch ", epoch, " batch ", batch_in_epoch, " done ",
                               done_after(epoch, batch_in_epoch + 1), ":");
    for (size_t i = 0; i < indices.size(); ++i) line += str_cat(i == 0 ? " " : ",", indices[i]);
    log_indices(line);
  }
  // The rows a batch should have, to count what the dataset skipped.
  const int64_t size = options_.batch_size();
  const int64_t samples = rest_ && rest_->epoch == epoch
                              ? rest_->first_batch * size + static_cast<int64_t>(rest_->indices.size())
                              : sampler_->num_samples();
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
  pending_.reset();
  rest_.reset();
  position_ = epoch * batches_per_epoch_ + batch_in_epoch;
  skipped_in_epoch_ = 0;
}

int64_t DataLoader::done_after(int64_t epoch, int64_t batch_in_epoch) const {
  const int64_t per_batch = options_.batch_size() * sampler_->world_size();
  if (rest_ && rest_->epoch == epoch) {
    return std::min(rest_->done + std::max<int64_t>(0, batch_in_epoch - rest_->first_batch) * per_batch,
                    sampler_->epoch_length());
  }
  return std::min(batch_in_epoch * per_batch, sampler_->epoch_length());
}

void DataLoader::log_indices(const std::string& line) const {
  std::ofstream out(options_.index_log(), std::ios::app);
  out << line << '\n';
  LOCKSTEP_CHECK(out.good(), "data loader: cannot append to index_log ", options_.index_log());
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
      options_.num_workers(), options_.prefetch() * std::max(1, options_.num_workers()), options_.pin_memory(),
      options_.timeout());
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
  state.values["world_size"] = sampler_->world_size();
  state.values["batch_size"] = options_.batch_size();
  state.values["done"] = done_after(epoch(), batch_in_epoch());
  if (rest_ && rest_->epoch == epoch()) state.values["resharded_at"] = rest_->done;
  return state;
}

void DataLoader::load_state(const State& state) {
  const auto& values = state.values;
  for (const char* key : {"epoch", "batch_in_epoch"}) {
    LOCKSTEP_CHECK(values.is_object() && values.contains(key) && values[key].is_number_integer(),
                   "data loader state: missing integer '", key, "' (got ", values.dump(), ")");
  }
  const int64_t epoch = values["epoch"].get<int64_t>(), batch_in_epoch = values["batch_in_epoch"].get<int64_t>();
  const int world = sampler_->world_size();
  const int64_t batch = options_.batch_size();
  // States written before these keys existed were saved by the same shape.
  const int saved_world = values.value("world_size", world);
  const int64_t saved_batch = values.value("batch_size", batch);
  const bool same_shape = saved_world == world && saved_batch == batch;
  if (same_shape && values.contains("batches_per_epoch")) {
    const auto saved = values["batches_per_epoch"].get<int64_t>();
    LOCKSTEP_CHECK(saved == batches_per_epoch_, "data loader state: saved with ", saved,
                   " batches per epoch, but this loader has ", batches_per_epoch_,
                   " (the dataset or the sampler changed), so the saved position would name different data");
  }
  const bool resharded_before = values.contains("resharded_at");
  int64_t rest_from = 0;
  if (same_shape) {
    rest_from = resharded_before ? values["resharded_at"].get<int64_t>() : 0;
  } else {
    LOCKSTEP_CHECK(values.contains("done"), "data loader state: saved by ", saved_world, " rank(s) with batch_size ",
                   saved_batch, " without the position in the epoch ('done'), so it cannot resume at ", world,
                   " rank(s) with batch_size ", batch);
    rest_from = values["done"].get<int64_t>();
  }
  seek(epoch, same_shape ? batch_in_epoch : 0);
  if (rest_from > 0) {
    std::optional<std::vector<int64_t>> rest = sampler_->rest_of_epoch(epoch, rest_from);
    LOCKSTEP_CHECK(rest.has_value(), "data loader state: saved by ", saved_world, " rank(s) with batch_size ",
                   saved_batch, ", but this loader has ", world, " rank(s) with batch_size ", batch,
                   ", and its sampler cannot share the rest of an interrupted epoch among other ranks (DefaultSampler "
                   "can; an InfiniteSampler's batches straddle epochs): resume with ", saved_world,
                   " rank(s) and batch_size ", saved_batch);
    const int64_t entries = static_cast<int64_t>(rest->size());
    const int64_t rest_batches = options_.drop_last() ? entries / batch : (entries + batch - 1) / batch;
    LOCKSTEP_CHECK(rest_batches <= batches_per_epoch_, "data loader: the rest of epoch ", epoch, " has ",
                   rest_batches, " batches, more than a whole epoch's ", batches_per_epoch_);
    const int64_t first = batches_per_epoch_ - rest_batches;
    if (rest_batches == 0) {
      seek(epoch + 1, 0);
    } else {
      LOCKSTEP_CHECK(!same_shape || batch_in_epoch >= first, "data loader state: batch ", batch_in_epoch,
                     " of epoch ", epoch, " lies before its re-sharded rest (batches ", first, " on)");
      seek(epoch, same_shape ? batch_in_epoch : first);
      rest_ = RestOfEpoch{epoch, first, rest_from, std::move(*rest)};
    }
    if (!same_shape) {
      const int64_t remaining = std::max<int64_t>(0, sampler_->epoch_length() - rest_from);
      logger().info("data loader: resuming epoch {} after {} of its {} samples, saved by {} rank(s) with batch_size "
                    "{}, now {} with batch_size {}: the remaining {} samples are re-sharded, {} per rank ({} of them "
                    "padding), in batches {}..{} of the epoch",
                    epoch, rest_from, sampler_->epoch_length(), saved_world, saved_batch, world, batch, remaining,
                    entries, std::max<int64_t>(0, entries * world - remaining), first, batches_per_epoch_ - 1);
    }
  }
  if (!options_.index_log().empty()) {
    log_indices(str_cat("resume epoch ", this->epoch(), " done ", done_after(this->epoch(), this->batch_in_epoch()),
                        " of ", sampler_->epoch_length(), ", world ", world));
  }
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
  options.timeout(cfg.get<double>("timeout", options.timeout()));
  LOCKSTEP_CHECK(options.timeout() >= 0, cfg.where("timeout"),
                 ": timeout must be >= 0 seconds (0 waits without limit), got ", options.timeout());
  options.drop_last(cfg.get<bool>("drop_last", false));
  options.pin_memory(cfg.get<bool>("pin_memory", false));
  std::string index_log = cfg.get<std::string>("index_log", "");
  for (auto at = index_log.find("{rank}"); at != std::string::npos; at = index_log.find("{rank}")) {
    index_log.replace(at, 6, std::to_string(ctx.rank));
  }
  options.index_log(index_log);
  // Mixing in the rank keeps ranks from applying the same random draws to
  // their (different) examples.
  options.seed(batch_seed(ctx.seed, ctx.rank, -1));
  const Config dataset_cfg = cfg.at("dataset");
  // `indices` is read after the dataset is built (it needs its size), so it is
  // marked read now, before the dataset's builder rejects keys it did not read.
  const Config indices = dataset_cfg.is_map() ? dataset_cfg.child("indices") : Config();
  if (!indices.is_null()) mark_used(indices);
  std::shared_ptr<Dataset> dataset = subset_from_config(dataset_registry().build(dataset_cfg), indices);
  std::shared_ptr<Sampler> sampler = sampler_registry().build(cfg.at("sampler"), dataset->size(), ctx);
  check_all_used(cfg, "data loader");
  return std::make_unique<DataLoader>(std::move(dataset), std::move(sampler), options);
}

}  // namespace lockstep
