// SampleRandom: the random draws of one example's augmentation.
//
// Seeded from the example's own seed (example_seed(epoch_seed, index)), so an
// augmentation depends on (seed, epoch, index) only: not on the worker that
// builds the batch, nor on the other examples of the batch. xoshiro256**
// (Blackman and Vigna), seeded through splitmix64; the same numbers on every
// platform and libtorch version.
//
//   lockstep::SampleRandom random(seed);
//   double scale = random.uniform(0.08, 1.0);
//   int64_t top = random.integer(0, height - h + 1);   // [0, height - h]
//   bool flip = random.uniform(0.0, 1.0) < 0.5;
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "lockstep/core/rng.h"

namespace lockstep {

class SampleRandom {
 public:
  explicit SampleRandom(uint64_t seed) {
    for (uint64_t& word : state_) {
      seed = splitmix64(seed);
      word = seed;
    }
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [low, high), from 53 random bits.
  double uniform(double low, double high) {
    return low + (high - low) * (static_cast<double>(next() >> 11) * 0x1.0p-53);
  }

  // Uniform integer in [low, high); high > low. Lemire's unbiased multiply-shift.
  int64_t integer(int64_t low, int64_t high) {
    const uint64_t range = static_cast<uint64_t>(high - low);
    unsigned __int128 product = static_cast<unsigned __int128>(next()) * range;
    uint64_t fraction = static_cast<uint64_t>(product);
    if (fraction < range) {
      const uint64_t threshold = (0 - range) % range;
      while (fraction < threshold) {
        product = static_cast<unsigned __int128>(next()) * range;
        fraction = static_cast<uint64_t>(product);
      }
    }
    return low + static_cast<int64_t>(product >> 64);
  }

  // A uniformly random order of 0 .. n-1 (Fisher-Yates).
  std::vector<int> permutation(int n) {
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    for (int i = n - 1; i > 0; --i) std::swap(order[i], order[integer(0, i + 1)]);
    return order;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

}  // namespace lockstep
