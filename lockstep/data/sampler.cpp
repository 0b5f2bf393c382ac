#include "lockstep/data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace lockstep {
namespace {

void check_shape(const char* what, int64_t size, int rank, int world) {
  LOCKSTEP_CHECK(size >= 0, what, ": dataset size must be non-negative, got ", size);
  LOCKSTEP_CHECK(world >= 1, what, ": world size must be at least 1, got ", world);
  LOCKSTEP_CHECK(rank >= 0 && rank < world, what, ": rank ", rank, " is outside 0..", world - 1);
}

void check_epoch(int64_t epoch) {
  LOCKSTEP_CHECK(epoch >= 0, "sampler: epoch must be non-negative, got ", epoch);
}

}  // namespace

SequentialSampler::SequentialSampler(int64_t size, int rank, int world) : size_(size), rank_(rank), world_(world) {
  check_shape("SequentialSampler", size, rank, world);
}

std::vector<int64_t> SequentialSampler::epoch_indices(int64_t epoch) const {
  check_epoch(epoch);
  std::vector<int64_t> indices;
  indices.reserve(num_samples());
  for (int64_t i = rank_; i < size_; i += world_) indices.push_back(i);
  return indices;
}

int64_t SequentialSampler::num_samples() const {
  return size_ > rank_ ? (size_ - rank_ + world_ - 1) / world_ : 0;
}

DefaultSampler::DefaultSampler(int64_t size, bool shuffle, uint64_t seed, int rank, int world, bool round_up)
    : size_(size), shuffle_(shuffle), seed_(seed), rank_(rank), world_(world), round_up_(round_up) {
  check_shape("DefaultSampler", size, rank, world);
}

int64_t DefaultSampler::num_samples() const {
  if (round_up_) return (size_ + world_ - 1) / world_;
  return size_ > rank_ ? (size_ - rank_ + world_ - 1) / world_ : 0;
}

std::vector<int64_t> DefaultSampler::permutation(int64_t epoch) const {
  check_epoch(epoch);
  std::vector<int64_t> order(size_);
  if (!shuffle_) {
    for (int64_t i = 0; i < size_; ++i) order[i] = i;
    return order;
  }
  // A private generator: the order must not depend on who else drew random
  // numbers before (model init, augmentation), or ranks would disagree.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch));
  torch::Tensor perm = torch::randperm(size_, generator, torch::kLong);
  std::copy(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + size_, order.begin());
  return order;
}

std::vector<int64_t> DefaultSampler::epoch_indices(int64_t epoch) const {
  const std::vector<int64_t> order = permutation(epoch);
  const int64_t total = round_up_ ? num_samples() * world_ : size_;
  std::vector<int64_t> indices;
  indices.reserve(num_samples());
  // Position p >= size repeats order[p % size]: mmengine's (indices * k)[:total].
  for (int64_t p = rank_; p < total; p += world_) indices.push_back(order[p % size_]);
  return indices;
}

std::optional<std::vector<int64_t>> DefaultSampler::rest_of_epoch(int64_t epoch, int64_t done) const {
  LOCKSTEP_CHECK(done >= 0, "DefaultSampler: ", done, " entries of an epoch cannot be done");
  const std::vector<int64_t> order = permutation(epoch);
  const int64_t rest = std::max<int64_t>(0, size_ - done);
  const int64_t total = round_up_ ? (rest + world_ - 1) / world_ * world_ : rest;
  std::vector<int64_t> indices;
  for (int64_t p = rank_; p < total; p += world_) indices.push_back(order[done + p % rest]);
  return indices;
}

Registry<Sampler, int64_t, const SamplerContext&>& sampler_registry() {
  static Registry<Sampler, int64_t, const SamplerContext&> registry("sampler");
  return registry;
}

namespace {

uint64_t seed_from(const Config& cfg, const SamplerContext& ctx) {
  if (!cfg.has("seed")) return ctx.seed;
  const int64_t seed = cfg.get<int64_t>("seed");
  LOCKSTEP_CHECK(seed >= 0, cfg.where("seed"), ": seed must be non-negative, got ", seed);
  return static_cast<uint64_t>(seed);
}

}  // namespace

LOCKSTEP_REGISTER(sampler_registry(), "SequentialSampler",
                  [](const Config& cfg, int64_t size, const SamplerContext& ctx) {
                    return std::make_shared<SequentialSampler>(size, ctx.rank, ctx.world_size);
                  });

LOCKSTEP_REGISTER(sampler_registry(), "DefaultSampler", [](const Config& cfg, int64_t size, const SamplerContext& ctx) {
  return std::make_shared<DefaultSampler>(size, cfg.get<bool>("shuffle", true), seed_from(cfg, ctx), ctx.rank,
                                          ctx.world_size, cfg.get<bool>("round_up", true));
});

LOCKSTEP_REGISTER(sampler_registry(), "InfiniteSampler",
                  [](const Config& cfg, int64_t size, const SamplerContext& ctx) {
                    return std::make_shared<InfiniteSampler>(size, cfg.get<bool>("shuffle", true),
                                                             seed_from(cfg, ctx), ctx.rank, ctx.world_size);
                  });

}  // namespace lockstep
