// DataLoader: an endless, resumable stream of batches, built by worker threads.
//
// The loader cuts the sampler's indices into batches and numbers them by
// (epoch, batch_in_epoch). next() walks that numbering forever, crossing epoch
// boundaries, so an epoch-based and an iteration-based trainer use it alike.
// The stream is a pure function of the sampler, the dataset and the options:
// worker count, timing and interruptions never change it, which is what makes
// seek() (resume from a checkpoint) return exactly the batches an
// uninterrupted run would have seen.
//
//   auto loader = lockstep::DataLoader(dataset, sampler,
//                                      lockstep::DataLoaderOptions().batch_size(64).num_workers(2));
//   for (int64_t i = 0; i < 1000; ++i) train_step(loader.next());
//   state.put("loader", loader.state());          // {epoch, batch_in_epoch}
//   ...
//   loader.load_state(state.get("loader"));        // next() continues where it was
//
//   // One finite pass for evaluation, leaving next()'s position alone:
//   val_loader.for_each_batch(/*epoch=*/0, [&](const lockstep::Batch& batch) { evaluate(batch); });
//
//   // From an mmengine-style section:
//   //   {batch_size: 64, num_workers: 2, drop_last: false, pin_memory: true,
//   //    sampler: {type: DefaultSampler, shuffle: true},
//   //    dataset: {type: FashionMNIST, split: train}}
//   auto train = lockstep::build_data_loader(cfg.at("train_dataloader"), {rank, world_size, seed});
//
// Workers are threads (C++ has no GIL). With num_workers = 0 batches are built
// inside next(). With N workers, up to prefetch * N batches are built ahead
// into a bounded queue and handed out in stream order. A dataset exception is
// thrown by the next() that would have returned that batch, prefixed with
// "data loader: epoch E, batch B"; the stream then goes on with batch B + 1.
// A dataset that skips unreadable examples returns short batches; the loader
// logs how many it skipped at the end of each epoch.
// next() and seek() belong to one thread; for_each_batch may run beside them.
//
// Waits are bounded: with workers, next() (and for_each_batch) waits at most
// `timeout` seconds for a batch, then throws naming the batch and the worker
// stuck building it ("data loader: waited 1800 s for epoch 0, batch 17:
// worker 1 has been building it for 1800 s (the dataset's get_batch has not
// returned); ..."), and that batch is skipped like a failed one. The loader's
// destructor leaves a worker still inside get_batch behind (detached) instead
// of joining it forever -- at once after such a timeout, otherwise after
// waiting up to `timeout` for it -- so a hung dataset cannot keep the process
// from exiting. Unlike
// PyTorch's DataLoader, whose timeout defaults to 0 (wait forever), lockstep's
// defaults to 1800 s so that a run is bounded unless its config asks
// otherwise; timeout 0 waits without limit. With num_workers 0 the batch is
// built by get_batch on the caller's own thread, so there is no thread to wait
// for and nothing is bounded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/arg.h>

#include "lockstep/config/config.h"
#include "lockstep/core/state.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/sampler.h"

namespace lockstep {

namespace detail {
class BatchPipeline;
}

struct DataLoaderOptions {
  TORCH_ARG(int64_t, batch_size) = 1;
  // Threads that build batches; 0 builds them inside next().
  TORCH_ARG(int, num_workers) = 0;
  // Batches built ahead per worker (torch's prefetch_factor).
  TORCH_ARG(int, prefetch) = 2;
  // Drop each epoch's last, short batch (finite samplers only; batches of an
  // infinite sampler straddle epochs and are always full).
  TORCH_ARG(bool, drop_last) = false;
  // Base of the per-batch augmentation seeds; see batch_seed().
  TORCH_ARG(uint64_t, seed) = 0;
  // Batches come out in page-locked memory, pinned by the worker that built
  // them, so the copy to the GPU (DataPreprocessor: non_blocking) overlaps
  // compute. Ignored, with a warning, where no GPU is visible (as torch's).
  TORCH_ARG(bool, pin_memory) = false;
  // A file this loader appends one line to per batch next() hands out:
  // "epoch E batch B done D: i,i,..." (D: entries of the epoch's order done
  // once every rank has this batch, see Sampler::rest_of_epoch), and one line
  // "resume epoch E done D of N, world W" per load_state(). For checking data
  // order across restarts; empty: none.
  TORCH_ARG(std::string, index_log) = "";
  // Seconds next() waits for a worker's batch before it throws (see the class
  // comment); 0 waits without limit. PyTorch's default is 0; lockstep's is
  // 1800 s. Ignored with num_workers 0.
  TORCH_ARG(double, timeout) = 1800;
};

// The seed the dataset receives for batch (epoch, batch_in_epoch): a splitmix64
// mix of the three, so it depends on the position only, not on the worker.
uint64_t batch_seed(uint64_t seed, int64_t epoch, int64_t batch_in_epoch);
// The seed a dataset with SeedScope::kEpoch receives for every batch of `epoch`.
uint64_t epoch_seed(uint64_t seed, int64_t epoch);

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler,
             DataLoaderOptions options = {});
  ~DataLoader();  // stops and joins the workers, even mid-epoch (a stuck one: see the class comment)
  C10_DISABLE_COPY_AND_ASSIGN(DataLoader);

  // len(loader) on this rank: ceil(num_samples / batch_size), or the floor with
  // drop_last. For an infinite sampler, num_samples / batch_size (at least 1):
  // it only numbers the stream in epochs.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

  // The batch at (epoch(), batch_in_epoch()); then moves one on, also when it
  // throws (the faulty batch is skipped).
  Batch next();
  int64_t epoch() const;
  int64_t batch_in_epoch() const;

  // The stream continues from (epoch, batch_in_epoch); 0 <= batch_in_epoch < batches_per_epoch().
  // Forgets a re-sharded epoch (below).
  void seek(int64_t epoch, int64_t batch_in_epoch);
  // Back to (0, 0), like detectron2's reset_data_loader.
  void reset() { seek(0, 0); }

  // One finite pass over `epoch` (the last batch short unless drop_last), with
  // the same batches, seeds and workers as next() would use, without moving
  // next()'s position. For an infinite sampler: one pass over the sampler's
  // epoch `epoch`. An exception from `visit` stops the pass and propagates.
  void for_each_batch(int64_t epoch, const std::function<void(const Batch&)>& visit) const;

  // {epoch, batch_in_epoch, batches_per_epoch, world_size, batch_size, done}
  // (done: entries of the epoch's order all ranks are past). Loaded by a loader
  // of the same world size and batch size, the stream continues exactly.
  // Loaded by another world size or batch size, the rest of the interrupted
  // epoch -- the order's entries from `done` on -- is shared among this
  // loader's ranks (Sampler::rest_of_epoch) and fills the epoch's last
  // batches, so that no sample of the epoch is skipped or taken twice (but for
  // padding to a multiple of the world size, as any epoch); the next epochs
  // are whole. It is logged how many samples were re-sharded. A sampler that
  // cannot re-shard, or a state saved with another batches_per_epoch by the
  // same world size and batch size (the dataset or sampler changed), is refused.
  State state() const;
  void load_state(const State& state);

  // Examples the dataset skipped as unreadable (on_bad_sample: skip) in the
  // batches next() returned so far. Each epoch's count is logged when its
  // last batch is handed out.
  int64_t skipped_samples() const { return skipped_total_; }

  const Dataset& dataset() const { return *dataset_; }
  const Sampler& sampler() const { return *sampler_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  // The pipeline that gives batches from position_ on (next() starts it on first use).
  void start_pipeline();
  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const Sampler> sampler_;
  DataLoaderOptions options_;
  int64_t batches_per_epoch_ = 0;
  int64_t position_ = 0;  // global number of the batch next() returns: epoch * batches_per_epoch + batch
  int64_t skipped_total_ = 0, skipped_in_epoch_ = 0;
  // The rest of an epoch re-sharded by load_state(): its batches are the
  // epoch's last ones, from first_batch on.
  struct RestOfEpoch {
    int64_t epoch = 0;
    int64_t first_batch = 0;
    int64_t done = 0;  // entries of the epoch's order done before it
    std::vector<int64_t> indices;
  };
  std::optional<RestOfEpoch> rest_;
  struct PendingIndices;
  std::shared_ptr<PendingIndices> pending_;  // with index_log: indices of batches built ahead
  // Entries of the epoch's order all ranks are past once batch_in_epoch batches are.
  int64_t done_after(int64_t epoch, int64_t batch_in_epoch) const;
  void log_indices(const std::string& line) const;
  std::unique_ptr<detail::BatchPipeline> pipeline_;  // started by next() at position_; dropped by seek()
};

// Builds a loader from an mmengine-style section: batch_size (required, > 0),
// num_workers (0), prefetch_factor (2), drop_last (false), timeout (1800
// seconds, >= 0; 0 waits without limit), index_log (none;
// "{rank}" in it becomes the rank), sampler and dataset
// ({type: ...} maps). The per-batch augmentation seeds derive from ctx.seed and
// ctx.rank, so ranks do not draw identical augmentations.
std::unique_ptr<DataLoader> build_data_loader(const Config& cfg, const SamplerContext& ctx);

}  // namespace lockstep
