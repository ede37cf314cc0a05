// ddp::Rng: xoshiro256** seeded through SplitMix64. We name and own the PRNG so
// that shuffles, initial weights and synthetic data are the same on every
// standard library and machine (std::shuffle and std::normal_distribution are
// not specified bit for bit).
#pragma once

#include <cstdint>
#include <array>

namespace ddp {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  // Seed from several words, e.g. (seed, epoch), mixed so nearby keys give
  // unrelated streams.
  Rng(uint64_t seed, uint64_t stream);

  uint64_t next_u64();
  // Uniform in [0, n), unbiased (Lemire's multiply-and-reject).
  uint64_t below(uint64_t n);
  // Uniform in [0, 1) with 24 random bits (exact in float).
  float uniform();
  // Standard normal (Box-Muller on 53-bit uniforms), deterministic.
  double normal();

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_{};
};

uint64_t splitmix64(uint64_t& x);

}  // namespace ddp
