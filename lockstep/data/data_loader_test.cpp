#include "lockstep/data/data_loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/compat/cuda.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using Indices = std::vector<int64_t>;

// x[i] = i, so a batch's x is exactly the indices it was built from.
std::shared_ptr<TensorDataset> arange_dataset(int64_t n) {
  return std::make_shared<TensorDataset>(
      Batch{{"x", torch::arange(n)}, {"y", torch::arange(n).to(torch::kFloat).mul(0.5)}});
}

// Random "augmentation" drawn from the batch seed, plus the seed itself.
class AugmentingDataset : public Dataset {
 public:
  explicit AugmentingDataset(int64_t n) : inner_(arange_dataset(n)) {}
  int64_t size() const override { return inner_->size(); }
  Batch get_batch(const Indices& indices, uint64_t seed) const override {
    Batch batch = inner_->get_batch(indices, seed);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    const auto n = static_cast<int64_t>(indices.size());
    batch.set("noise", torch::rand({n}, generator));
    batch.set("seed", torch::full({n}, static_cast<int64_t>(seed), torch::kLong));
    return batch;
  }

 private:
  std::shared_ptr<TensorDataset> inner_;
};

// Fails on any batch that holds example `bad`; counts calls.
class FailingDataset : public Dataset {
 public:
  FailingDataset(int64_t n, int64_t bad) : inner_(arange_dataset(n)), bad_(bad) {}
  int64_t size() const override { return inner_->size(); }
  Batch get_batch(const Indices& indices, uint64_t seed) const override {
    ++calls;
    if (std::find(indices.begin(), indices.end(), bad_) != indices.end()) {
      throw std::runtime_error("bad example " + std::to_string(bad_));
    }
    return inner_->get_batch(indices, seed);
  }
  mutable std::atomic<int> calls{0};

 private:
  std::shared_ptr<TensorDataset> inner_;
  int64_t bad_;
};

Indices to_indices(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

Indices slice(const Indices& v, int64_t begin, int64_t end) { return {v.begin() + begin, v.begin() + end}; }

std::vector<Batch> take(DataLoader& loader, int count) {
  std::vector<Batch> batches;
  for (int i = 0; i < count; ++i) batches.push_back(loader.next());
  return batches;
}

::testing::AssertionResult same(const Batch& a, const Batch& b) {
  if (a.names() != b.names()) return ::testing::AssertionFailure() << "different tensor names";
  for (const auto& name : a.names()) {
    if (!torch::equal(a.at(name), b.at(name))) {
      return ::testing::AssertionFailure() << "tensor '" << name << "' differs: " << a.at(name) << " vs "
                                           << b.at(name);
    }
  }
  return ::testing::AssertionSuccess();
}

using testing::error_of;

TEST(DataLoader, BatchesCutTheSamplerOrderAndCrossEpochs) {
  auto sampler = std::make_shared<DefaultSampler>(10, true, 3);
  DataLoader loader(arange_dataset(10), sampler, DataLoaderOptions().batch_size(4));
  EXPECT_EQ(loader.batches_per_epoch(), 3);  // 4 + 4 + 2
  for (int k = 0; k < 8; ++k) {
    const int64_t epoch = k / 3, b = k % 3;
    EXPECT_EQ(loader.epoch(), epoch);
    EXPECT_EQ(loader.batch_in_epoch(), b);
    const Indices order = sampler->epoch_indices(epoch);
    EXPECT_EQ(to_indices(loader.next().at("x")), slice(order, 4 * b, std::min<int64_t>(4 * b + 4, 10)))
        << "batch " << k;
  }
  EXPECT_EQ(loader.epoch(), 2);
  EXPECT_EQ(loader.batch_in_epoch(), 2);
}

TEST(DataLoader, DropLastDropsTheShortBatch) {
  auto sampler = std::make_shared<DefaultSampler>(10, true, 3);
  DataLoader loader(arange_dataset(10), sampler, DataLoaderOptions().batch_size(4).drop_last(true));
  EXPECT_EQ(loader.batches_per_epoch(), 2);
  auto batches = take(loader, 4);
  EXPECT_EQ(to_indices(batches[1].at("x")), slice(sampler->epoch_indices(0), 4, 8));
  // The third batch is already epoch 1: entries 8 and 9 of epoch 0 are skipped.
  EXPECT_EQ(to_indices(batches[2].at("x")), slice(sampler->epoch_indices(1), 0, 4));
  for (const auto& batch : batches) EXPECT_EQ(batch.size(), 4);
}

TEST(DataLoader, InfiniteSamplerBatchesStraddleEpochs) {
  auto sampler = std::make_shared<InfiniteSampler>(10, true, 8);
  DataLoader loader(arange_dataset(10), sampler, DataLoaderOptions().batch_size(4));
  EXPECT_EQ(loader.batches_per_epoch(), 2);  // 10 / 4: only numbers the stream
  Indices stream;
  for (int64_t e = 0; e < 3; ++e) {
    const Indices epoch = sampler->epoch_indices(e);
    stream.insert(stream.end(), epoch.begin(), epoch.end());
  }
  for (int k = 0; k < 7; ++k) {
    EXPECT_EQ(loader.epoch(), k / 2);
    Batch batch = loader.next();
    EXPECT_EQ(to_indices(batch.at("x")), slice(stream, 4 * k, 4 * k + 4)) << "batch " << k;
  }
}

TEST(DataLoader, SameBatchesForAnyWorkerCount) {
  auto dataset = std::make_shared<AugmentingDataset>(37);
  auto sampler = std::make_shared<DefaultSampler>(37, true, 1);
  auto run = [&](int workers) {
    DataLoader loader(dataset, sampler, DataLoaderOptions().batch_size(5).num_workers(workers).seed(99));
    return take(loader, 25);  // 8 batches per epoch: crosses three epoch boundaries
  };
  const auto inline_batches = run(0);
  for (int workers : {1, 3}) {
    const auto batches = run(workers);
    for (size_t k = 0; k < batches.size(); ++k) EXPECT_TRUE(same(batches[k], inline_batches[k])) << "batch " << k;
  }
  // The reference itself: x follows the sampler, seeds follow the position.
  EXPECT_EQ(to_indices(inline_batches[9].at("x")), slice(sampler->epoch_indices(1), 5, 10));
  EXPECT_EQ(to_indices(inline_batches[15].at("x")), slice(sampler->epoch_indices(1), 35, 37));
  EXPECT_EQ(inline_batches[9].at("seed")[0].item<int64_t>(), static_cast<int64_t>(batch_seed(99, 1, 1)));
}

TEST(DataLoader, PinMemoryWithoutAGpuKeepsTheBatchesAndSaysSo) {
  if (compat::can_pin_memory()) GTEST_SKIP() << "a GPU is visible: PinMemoryPinsEveryBatch covers it";
  auto dataset = std::make_shared<AugmentingDataset>(23);
  auto sampler = std::make_shared<DefaultSampler>(23, true, 1);
  DataLoader plain(dataset, sampler, DataLoaderOptions().batch_size(4).num_workers(2).seed(3));
  DataLoader pinned(dataset, sampler, DataLoaderOptions().batch_size(4).num_workers(2).seed(3).pin_memory(true));
  EXPECT_FALSE(pinned.options().pin_memory());  // turned off, with a warning, as torch's DataLoader does
  for (int k = 0; k < 9; ++k) EXPECT_TRUE(same(plain.next(), pinned.next())) << "batch " << k;
}

TEST(DataLoader, PinMemoryPinsEveryBatch) {
  if (!compat::can_pin_memory()) GTEST_SKIP() << "no CUDA device: page-locked memory needs one";
  auto dataset = std::make_shared<AugmentingDataset>(23);
  auto sampler = std::make_shared<DefaultSampler>(23, true, 1);
  for (int workers : {0, 2}) {
    DataLoader plain(dataset, sampler, DataLoaderOptions().batch_size(4).num_workers(workers).seed(3));
    DataLoader pinned(dataset, sampler,
                      DataLoaderOptions().batch_size(4).num_workers(workers).seed(3).pin_memory(true));
    for (int k = 0; k < 9; ++k) {
      Batch batch = pinned.next();
      for (const auto& item : batch) EXPECT_TRUE(item.second.is_pinned()) << item.first << ", batch " << k;
      EXPECT_TRUE(same(plain.next(), batch)) << "batch " << k;
    }
  }
}

TEST(DataLoader, BatchSeedsDependOnPositionOnly) {
  std::set<uint64_t> seeds;
  for (uint64_t base : {0, 1})
    for (int64_t e = 0; e < 10; ++e)
      for (int64_t b = 0; b < 10; ++b) seeds.insert(batch_seed(base, e, b));
  EXPECT_EQ(seeds.size(), 200u);
  EXPECT_EQ(batch_seed(5, 2, 3), batch_seed(5, 2, 3));
  EXPECT_NE(batch_seed(5, 2, 3), batch_seed(5, 3, 2));
}

TEST(DataLoader, SeekGivesWhatAnUninterruptedRunGives) {
  auto dataset = std::make_shared<AugmentingDataset>(23);
  auto sampler = std::make_shared<DefaultSampler>(23, true, 4);
  const auto options = DataLoaderOptions().batch_size(4).num_workers(2).seed(7);
  DataLoader reference(dataset, sampler, options);
  const auto expected = take(reference, 15);  // 6 batches per epoch
  DataLoader loader(dataset, sampler, options);
  take(loader, 3);  // with work in flight
  for (int k : {13, 6, 0, 11, 5}) {
    loader.seek(k / 6, k % 6);
    EXPECT_EQ(loader.epoch(), k / 6);
    EXPECT_EQ(loader.batch_in_epoch(), k % 6);
    EXPECT_TRUE(same(loader.next(), expected[k])) << "seek to batch " << k;
    EXPECT_TRUE(same(loader.next(), expected[k + 1])) << "after seek to batch " << k;
  }
  loader.reset();
  EXPECT_EQ(loader.epoch(), 0);
  EXPECT_TRUE(same(loader.next(), expected[0]));
  EXPECT_THAT(error_of([&] { loader.seek(1, 6); }), HasSubstr("cannot seek to batch 6 of epoch 1"));
  EXPECT_THROW(loader.seek(-1, 0), Error);
}

TEST(DataLoader, StateRoundTripResumesTheStream) {
  auto dataset = std::make_shared<AugmentingDataset>(23);
  auto sampler = std::make_shared<InfiniteSampler>(23, true, 4);
  const auto options = DataLoaderOptions().batch_size(4).seed(7);
  DataLoader reference(dataset, sampler, options);
  const auto expected = take(reference, 12);
  State saved;
  {
    DataLoader first(dataset, sampler, DataLoaderOptions(options).num_workers(2));
    take(first, 7);
    saved = first.state();
    EXPECT_EQ(saved.values["epoch"], 1);  // 5 batches per epoch
    EXPECT_EQ(saved.values["batch_in_epoch"], 2);
  }
  DataLoader resumed(dataset, sampler, options);
  resumed.load_state(saved);
  for (int k = 7; k < 12; ++k) EXPECT_TRUE(same(resumed.next(), expected[k])) << "batch " << k;

  DataLoader other_dataset(arange_dataset(30), std::make_shared<InfiniteSampler>(30, true, 4), options);
  EXPECT_THAT(error_of([&] { other_dataset.load_state(saved); }),
              HasSubstr("saved with 5 batches per epoch, but this loader has 7 (the dataset or the sampler changed)"));
  // An infinite stream is not cut at epochs: it cannot be re-shared among other ranks.
  DataLoader other_batch(dataset, sampler, DataLoaderOptions().batch_size(5));
  EXPECT_THAT(error_of([&] { other_batch.load_state(saved); }),
              HasSubstr("saved by 1 rank(s) with batch_size 4, but this loader has 1 rank(s) with batch_size 5, and "
                        "its sampler cannot share the rest of an interrupted epoch"));
  EXPECT_THAT(error_of([&] { resumed.load_state(State()); }), HasSubstr("missing integer 'epoch'"));
}

// The ranks of one world, each with its loader over the same dataset.
std::vector<std::unique_ptr<DataLoader>> world_of(int world, int64_t size, int64_t batch, bool drop_last = false) {
  std::vector<std::unique_ptr<DataLoader>> loaders;
  for (int rank = 0; rank < world; ++rank) {
    loaders.push_back(std::make_unique<DataLoader>(arange_dataset(size),
                                                   std::make_shared<DefaultSampler>(size, true, 5, rank, world),
                                                   DataLoaderOptions().batch_size(batch).drop_last(drop_last)));
  }
  return loaders;
}

// Every rank takes `steps` batches (all of them: to the end of the epoch);
// the indices go into `seen`.
void step_all(std::vector<std::unique_ptr<DataLoader>>& loaders, int64_t steps, std::vector<int64_t>& seen) {
  const int64_t epoch = loaders[0]->epoch();
  for (int64_t k = 0; k < steps && loaders[0]->epoch() == epoch; ++k) {
    for (auto& loader : loaders) {
      ASSERT_EQ(loader->epoch(), epoch);
      const Indices indices = to_indices(loader->next().at("x"));
      seen.insert(seen.end(), indices.begin(), indices.end());
    }
  }
}

TEST(DataLoader, ResumingAtAnotherWorldSizeTakesEachSampleOfTheEpochOnce) {
  struct Case {
    int from_world, to_world;
    int64_t from_batch, to_batch, steps, padding;
  };
  // 60 samples: 3 -> 2 ranks, 2 -> 4, 4 -> 3 (one sample of padding), and a new batch size.
  for (const Case c : {Case{3, 2, 4, 4, 2, 0}, Case{2, 4, 4, 4, 3, 0}, Case{4, 3, 4, 4, 1, 1}, Case{2, 2, 4, 6, 3, 0},
                       Case{3, 2, 4, 4, 0, 0}}) {
    SCOPED_TRACE(::testing::Message() << c.from_world << " ranks, batch " << c.from_batch << " -> " << c.to_world
                                      << " ranks, batch " << c.to_batch << " after " << c.steps << " steps");
    auto before = world_of(c.from_world, 60, c.from_batch);
    std::vector<int64_t> seen;
    step_all(before, c.steps, seen);
    const State saved = before[1 % c.from_world]->state();
    EXPECT_EQ(saved.values["done"], c.steps * c.from_batch * c.from_world);
    auto after = world_of(c.to_world, 60, c.to_batch);
    for (auto& loader : after) loader->load_state(saved);
    EXPECT_EQ(after[0]->epoch(), 0);
    const int64_t rest_batches = after[0]->batches_per_epoch() - after[0]->batch_in_epoch();
    step_all(after, after[0]->batches_per_epoch(), seen);
    EXPECT_EQ(after[0]->epoch(), 1) << "the rest took " << rest_batches << " batches";
    std::map<int64_t, int> count;
    for (int64_t index : seen) ++count[index];
    EXPECT_EQ(count.size(), 60u);
    int repeated = 0;
    for (const auto& [index, n] : count) repeated += n - 1;
    EXPECT_EQ(repeated, c.padding);
    // The next epoch is whole, as a fresh loader of the new world has it.
    auto fresh = world_of(c.to_world, 60, c.to_batch);
    for (int rank = 0; rank < c.to_world; ++rank) {
      fresh[rank]->seek(1, 0);
      EXPECT_TRUE(same(after[rank]->next(), fresh[rank]->next())) << "rank " << rank;
    }
  }
}

TEST(DataLoader, ResumingInsideAReshardedEpochAtTheSameWorldIsExact) {
  auto before = world_of(3, 60, 4);
  std::vector<int64_t> seen;
  step_all(before, 2, seen);
  auto after = world_of(2, 60, 4);
  for (auto& loader : after) loader->load_state(before[0]->state());
  step_all(after, 1, seen);
  const State saved = after[1]->state();
  EXPECT_EQ(saved.values["resharded_at"], 24);
  EXPECT_EQ(saved.values["done"], 32);
  auto again = world_of(2, 60, 4);
  for (auto& loader : again) loader->load_state(saved);
  for (int k = 0; k < 8; ++k) {
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(same(after[rank]->next(), again[rank]->next())) << "rank " << rank << ", batch " << k;
    }
  }
  // And from there at a third world size, still each sample once.
  auto third = world_of(3, 60, 4);
  for (auto& loader : third) loader->load_state(saved);
  step_all(third, 20, seen);
  std::set<int64_t> distinct(seen.begin(), seen.end());
  EXPECT_EQ(distinct.size(), 60u);
  EXPECT_EQ(seen.size(), 62u);  // the last 28 samples over 3 ranks: 2 of padding
}

TEST(DataLoader, IndexLogNamesEachBatchAndResume) {
  testing::TempDir dir;
  const std::string path = dir.file("log.txt");
  auto options = DataLoaderOptions().batch_size(4).index_log(path);
  auto sampler = std::make_shared<DefaultSampler>(10, false, 0, /*rank=*/1, /*world=*/2);
  DataLoader loader(arange_dataset(10), sampler, options);
  loader.next();
  loader.next();
  DataLoader resumed(arange_dataset(10), std::make_shared<DefaultSampler>(10, false, 0, 0, 1), options);
  resumed.load_state(loader.state());
  resumed.next();
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text,
            "epoch 0 batch 0 done 8: 1,3,5,7\n"
            "epoch 0 batch 1 done 10: 9\n"
            "resume epoch 1 done 0 of 10, world 1\n"
            "epoch 1 batch 0 done 4: 0,1,2,3\n");
}

TEST(DataLoader, ForEachBatchIsOneEpochAndLeavesNextAlone) {
  auto dataset = std::make_shared<AugmentingDataset>(10);
  auto sampler = std::make_shared<DefaultSampler>(10, true, 2);
  for (int workers : {0, 3}) {
    const auto options = DataLoaderOptions().batch_size(4).num_workers(workers).seed(1);
    DataLoader reference(dataset, sampler, options);
    const auto expected = take(reference, 6);
    DataLoader loader(dataset, sampler, options);
    take(loader, 2);
    std::vector<Batch> pass;
    loader.for_each_batch(1, [&](const Batch& batch) { pass.push_back(batch); });
    ASSERT_EQ(pass.size(), 3u);
    for (int b = 0; b < 3; ++b) EXPECT_TRUE(same(pass[b], expected[3 + b])) << "epoch 1 batch " << b;
    EXPECT_EQ(loader.epoch(), 0);
    EXPECT_EQ(loader.batch_in_epoch(), 2);
    EXPECT_TRUE(same(loader.next(), expected[2]));
  }
}

TEST(DataLoader, ForEachBatchOnUnevenEvaluationShards) {
  // 10 examples over 3 ranks without padding: rank 2 gets 3 = one batch of 2 and one of 1.
  auto sampler = std::make_shared<DefaultSampler>(10, false, 0, 2, 3, /*round_up=*/false);
  DataLoader loader(arange_dataset(10), sampler, DataLoaderOptions().batch_size(2).num_workers(2));
  std::vector<Indices> seen;
  loader.for_each_batch(0, [&](const Batch& batch) { seen.push_back(to_indices(batch.at("x"))); });
  EXPECT_EQ(seen, (std::vector<Indices>{{2, 5}, {8}}));

  // A rank with nothing to evaluate visits nothing (and must not hang).
  auto empty = std::make_shared<DefaultSampler>(2, false, 0, 2, 3, false);
  DataLoader idle(arange_dataset(2), empty, DataLoaderOptions().batch_size(2).num_workers(2));
  int visits = 0;
  idle.for_each_batch(0, [&](const Batch&) { ++visits; });
  EXPECT_EQ(visits, 0);
  EXPECT_THAT(error_of([&] { idle.next(); }), HasSubstr("0 samples per epoch"));
}

TEST(DataLoader, ForEachBatchPropagatesTheVisitorsException) {
  DataLoader loader(arange_dataset(40), std::make_shared<SequentialSampler>(40),
                    DataLoaderOptions().batch_size(2).num_workers(3));
  int visits = 0;
  EXPECT_THROW(loader.for_each_batch(0,
                                     [&](const Batch&) {
                                       if (++visits == 2) throw Error("stop here");
                                     }),
               Error);
  EXPECT_EQ(visits, 2);
}

TEST(DataLoader, WorkerExceptionReachesTheCallerWithItsPosition) {
  for (int workers : {0, 1, 3}) {
    auto dataset = std::make_shared<FailingDataset>(20, 7);
    DataLoader loader(dataset, std::make_shared<SequentialSampler>(20),
                      DataLoaderOptions().batch_size(4).num_workers(workers));
    EXPECT_EQ(to_indices(loader.next().at("x")), (Indices{0, 1, 2, 3}));
    EXPECT_EQ(error_of([&] { loader.next(); }), "data loader: epoch 0, batch 1: bad example 7")
        << workers << " workers";
    // The stream goes on after the faulty batch.
    EXPECT_EQ(loader.batch_in_epoch(), 2);
    EXPECT_EQ(to_indices(loader.next().at("x")), (Indices{8, 9, 10, 11}));
  }
}

TEST(DataLoader, OutOfRangeIndicesNameThePosition) {
  // The sampler believes in 12 examples, the dataset has 10.
  DataLoader loader(arange_dataset(10), std::make_shared<SequentialSampler>(12),
                    DataLoaderOptions().batch_size(4).num_workers(2));
  take(loader, 2);
  const std::string message = error_of([&] { loader.next(); });
  EXPECT_THAT(message, HasSubstr("epoch 0, batch 2"));
  EXPECT_THAT(message, HasSubstr("index 10 (position 2 of the batch) is out of range for a dataset of 10"));
}

TEST(DataLoader, DestructorStopsWorkersWhenEveryBatchFails) {
  auto dataset = std::make_shared<FailingDataset>(8, 0);
  auto always = std::make_shared<DefaultSampler>(8, false, 0);
  {
    // batch_size 8 = the whole dataset: every batch holds example 0 and fails, so the queue fills with errors.
    DataLoader loader(dataset, always, DataLoaderOptions().batch_size(8).num_workers(3).prefetch(1));
    EXPECT_THROW(loader.next(), Error);
    EXPECT_THROW(loader.next(), Error);
  }  // must return
  EXPECT_GE(dataset->calls.load(), 2);
}

// Counts calls and takes a little while, so workers are busy when the loader goes.
class SlowDataset : public Dataset {
 public:
  int64_t size() const override { return 1000; }
  Batch get_batch(const Indices& indices, uint64_t) const override {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Batch{{"x", torch::tensor(indices)}};
  }
  mutable std::atomic<int> calls{0};
};

TEST(DataLoader, DestructorMidEpochJoinsWorkersAndPrefetchIsBounded) {
  auto dataset = std::make_shared<SlowDataset>();
  {
    DataLoader loader(dataset, std::make_shared<SequentialSampler>(1000),
                      DataLoaderOptions().batch_size(2).num_workers(3).prefetch(2));
    loader.next();
    // Let the workers fill the queue: 1 delivered + 3 workers x 2 ahead.
    while (dataset->calls.load() < 7) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(dataset->calls.load(), 7) << "workers built more batches than the prefetch bound";
  }
  const int after = dataset->calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(dataset->calls.load(), after) << "a worker outlived the loader";
}

TEST(DataLoader, DestructorRightAfterConstructionAndMidStream) {
  auto dataset = std::make_shared<SlowDataset>();
  for (int consumed : {0, 1, 5}) {
    DataLoader loader(dataset, std::make_shared<DefaultSampler>(1000, true, 0),
                      DataLoaderOptions().batch_size(16).num_workers(4));
    take(loader, consumed);
  }
  SUCCEED();  // reaching here means every destructor returned
}

// get_batch blocks until the test releases it: a read from a hung file system.
class BlockingDataset : public Dataset {
 public:
  int64_t size() const override { return 8; }
  Batch get_batch(const Indices& indices, uint64_t) const override {
    ++calls;
    std::unique_lock<std::mutex> lock(mutex_);
    released_cv_.wait(lock, [&] { return released_; });
    return Batch{{"x", torch::tensor(indices)}};
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      released_ = true;
    }
    released_cv_.notify_all();
  }
  mutable std::atomic<int> calls{0};

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable released_cv_;
  bool released_ = false;
};

double seconds_from(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(DataLoader, TimeoutNamesTheStuckWorkerAndTheDestructorLeavesItBehind) {
  auto dataset = std::make_shared<BlockingDataset>();
  std::chrono::steady_clock::time_point destroying;
  {
    DataLoader loader(dataset, std::make_shared<SequentialSampler>(8),
                      DataLoaderOptions().batch_size(2).num_workers(1).timeout(0.5));
    const auto start = std::chrono::steady_clock::now();
    const std::string message = error_of([&] { loader.next(); });
    const double waited = seconds_from(start);
    EXPECT_GE(waited, 0.45);
    EXPECT_LT(waited, 5);
    EXPECT_THAT(message, HasSubstr("data loader: waited 0.5 s for epoch 0, batch 0: worker 0 has been building it for "));
    EXPECT_THAT(message, HasSubstr("the dataset's get_batch has not returned"));
    EXPECT_THAT(message, HasSubstr("train_dataloader.timeout"));
    // The timed-out batch is skipped, like a failed one.
    EXPECT_EQ(loader.batch_in_epoch(), 1);
    EXPECT_EQ(dataset->calls.load(), 1);
    destroying = std::chrono::steady_clock::now();
  }  // must not wait for the worker stuck in get_batch
  EXPECT_LT(seconds_from(destroying), 5) << "the destructor waited for the stuck worker";
  // Once get_batch returns, the left-behind worker exits and frees the
  // pipeline's state, the last holder of the dataset but this test.
  dataset->release();
  const auto released = std::chrono::steady_clock::now();
  while (dataset.use_count() > 1 && seconds_from(released) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(dataset.use_count(), 1) << "the left-behind worker did not finish";
  EXPECT_EQ(dataset->calls.load(), 1) << "the left-behind worker built another batch";
}

TEST(DataLoader, BadOptions) {
  auto data = arange_dataset(4);
  auto sampler = std::make_shared<SequentialSampler>(4);
  EXPECT_THAT(error_of([&] { DataLoader(data, sampler, DataLoaderOptions().batch_size(0)); }),
              HasSubstr("batch_size must be positive, got 0"));
  EXPECT_THROW(DataLoader(data, sampler, DataLoaderOptions().num_workers(-1)), Error);
  EXPECT_THROW(DataLoader(data, sampler, DataLoaderOptions().prefetch(0)), Error);
  EXPECT_THAT(error_of([&] { DataLoader(data, sampler, DataLoaderOptions().timeout(-1)); }),
              HasSubstr("timeout must be >= 0 seconds"));
  EXPECT_THROW(DataLoader(nullptr, sampler), Error);
  DataLoader short_loader(data, sampler, DataLoaderOptions().batch_size(8).drop_last(true));
  EXPECT_EQ(short_loader.batches_per_epoch(), 0);
  EXPECT_THAT(error_of([&] { short_loader.next(); }), HasSubstr("fewer than batch_size 8 with drop_last"));
}

TEST(BuildDataLoader, FromAnMmengineStyleSection) {
  const std::string yaml =
      "batch_size: 64\n"
      "num_workers: 2\n"
      "drop_last: false\n"
      "pin_memory: true\n"
      "timeout: 2.5\n"
      "sampler: {type: DefaultSampler, shuffle: false}\n"
      "dataset: {type: FashionMNIST, split: test}\n";
  SamplerContext ctx;
  auto loader = build_data_loader(parse_config(yaml, "loader.yaml"), ctx);
  EXPECT_EQ(loader->dataset().size(), 10000);
  EXPECT_EQ(loader->batches_per_epoch(), 157);  // ceil(10000 / 64)
  EXPECT_EQ(loader->options().timeout(), 2.5);
  Batch first = loader->next();
  EXPECT_EQ(first.at("image").sizes(), (std::vector<int64_t>{64, 1, 28, 28}));
  EXPECT_EQ(slice(to_indices(first.at("label")), 0, 12), (Indices{9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5}));

  // Two ranks split the shuffled data; the sampler's seed overrides the run's.
  ctx.rank = 1;
  ctx.world_size = 2;
  ctx.seed = 17;
  auto shard = build_data_loader(
      parse_config("{batch_size: 10, sampler: {type: DefaultSampler, seed: 5}, dataset: {type: FashionMNIST, "
                    "split: test}}"),
      ctx);
  EXPECT_EQ(shard->sampler().num_samples(), 5000);
  EXPECT_EQ(shard->options().timeout(), 1800);  // bounded by default, unlike PyTorch's 0
  EXPECT_EQ(shard->sampler().epoch_indices(1), DefaultSampler(10000, true, 5, 1, 2).epoch_indices(1));
}

TEST(BuildDataLoader, ErrorsNameTheKey) {
  const std::string rest = "sampler: {type: SequentialSampler}\ndataset: {type: FashionMNIST, split: test}\n";
  const std::string zero = error_of([&] { build_data_loader(parse_config("batch_size: 0\n" + rest, "l.yaml"), {}); });
  EXPECT_THAT(zero, HasSubstr("l.yaml:1"));
  EXPECT_THAT(zero, HasSubstr("batch_size must be positive, got 0"));
  const std::string typo = error_of(
      [&] { build_data_loader(parse_config("batch_size: 8\nnum_wrokers: 2\n" + rest, "l.yaml"), {}); });
  EXPECT_THAT(typo, HasSubstr("num_wrokers"));
  const std::string negative =
      error_of([&] { build_data_loader(parse_config("batch_size: 8\ntimeout: -1\n" + rest, "l.yaml"), {}); });
  EXPECT_THAT(negative, HasSubstr("l.yaml:2 (key timeout)"));
  EXPECT_THAT(negative, HasSubstr("timeout must be >= 0 seconds (0 waits without limit), got -1"));
  EXPECT_THAT(error_of([&] { build_data_loader(parse_config(rest, "l.yaml"), {}); }), HasSubstr("batch_size"));
}

}  // namespace
}  // namespace lockstep
