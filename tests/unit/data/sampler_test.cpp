// DistributedSampler: PyTorch's sharding, and Note [global step] (sampler.hpp)
// checked for the world sizes and dataset sizes the trainer meets.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "ddp/data/sampler.hpp"
#include "test_util.hpp"

namespace ddp::data {
namespace {

using testing::expect_error;
using Indices = std::vector<int64_t>;

Indices iota(int64_t n) {
  Indices v(n);
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

std::vector<Indices> shards(int64_t n, int world, uint64_t seed, uint64_t epoch,
                            bool shuffle = true, bool drop_last = true) {
  std::vector<Indices> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, seed, shuffle, drop_last);
    s.set_epoch(epoch);
    out.push_back(s.indices());
    EXPECT_EQ(int64_t(out.back().size()), s.num_samples());
  }
  return out;
}

TEST(Permutation, IsAPermutationDeterministicInSeedAndEpoch) {
  for (int64_t n : {0, 1, 2, 17, 1000}) {
    Indices p = permutation(n, 7, 3);
    EXPECT_EQ(p, permutation(n, 7, 3));
    std::sort(p.begin(), p.end());
    EXPECT_EQ(p, iota(n));
  }
  EXPECT_NE(permutation(1000, 7, 3), permutation(1000, 7, 4));
  EXPECT_NE(permutation(1000, 7, 3), permutation(1000, 8, 3));
  EXPECT_NE(permutation(1000, 7, 3), iota(1000));
}

TEST(Permutation, IsPinned) {
  // Checkpoints resume mid-epoch by position in this order: it must never
  // change silently (another PRNG, another Fisher-Yates direction).
  EXPECT_EQ(permutation(10, 0, 0), Indices({4, 0, 5, 3, 1, 6, 8, 9, 7, 2}));
  EXPECT_EQ(permutation(10, 42, 3), Indices({0, 2, 6, 9, 5, 8, 4, 3, 1, 7}));
}

TEST(Permutation, IsRoughlyUniform) {
  // Where element 0 lands, over many epochs: every position about equally often.
  const int n = 8, trials = 8000;
  std::vector<int> where(n);
  for (int e = 0; e < trials; ++e) {
    const Indices p = permutation(n, 1, e);
    ++where[std::find(p.begin(), p.end(), 0) - p.begin()];
  }
  for (int c : where) EXPECT_NEAR(c, trials / n, 150);
}

TEST(Sampler, ShardsAreDisjointEqualAndCoverThePermutationPrefix) {
  for (int64_t n : {1, 7, 12, 1000, 1003}) {
    for (int w = 1; w <= 5; ++w) {
      const auto sh = shards(n, w, 5, 2);
      const Indices perm = permutation(n, 5, 2);
      const int64_t per_rank = n / w;
      std::multiset<int64_t> all;
      for (const Indices& s : sh) {
        EXPECT_EQ(int64_t(s.size()), per_rank) << "n=" << n << " w=" << w;
        all.insert(s.begin(), s.end());
      }
      const std::multiset<int64_t> want(perm.begin(), perm.begin() + per_rank * w);
      EXPECT_EQ(all, want) << "n=" << n << " w=" << w;  // multiset: disjoint too
    }
  }
}

TEST(Sampler, RankTakesEveryWthOfThePermutation) {
  const Indices perm = permutation(100, 9, 1);
  DistributedSampler s(100, 3, 2, 9);
  s.set_epoch(1);
  const Indices mine = s.indices();
  ASSERT_EQ(mine.size(), 33u);
  for (size_t k = 0; k < mine.size(); ++k) EXPECT_EQ(mine[k], perm[2 + 3 * k]);
}

// --deterministic: a micro-shard (a contiguous block of a global batch) holds
// the same samples in the same order at every world size that divides it.
TEST(Sampler, ContiguousShardsAreTheSameBlocksAtEveryWorldSize) {
  const int64_t n = 1000, batch = 96;  // 10 whole global batches, 40 samples dropped
  const Indices perm = permutation(n, 4, 2);
  for (int world : {1, 2, 3, 4, 6, 8}) {
    SCOPED_TRACE(world);
    const int64_t b = batch / world;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(n, world, r, 4);
      s.set_contiguous(batch);
      s.set_epoch(2);
      const Indices mine = s.indices();
      ASSERT_EQ(int64_t(mine.size()), 10 * b);
      ASSERT_EQ(s.num_samples(), 10 * b);
      // Step t's part of this rank: positions t*B + r*b .. t*B + (r+1)*b - 1.
      for (int64_t k = 0; k < int64_t(mine.size()); ++k)
        ASSERT_EQ(mine[k], perm[(k / b) * batch + r * b + k % b]) << "rank " << r << ", sample " << k;
    }
  }
  DistributedSampler s(n, 5, 0, 4);
  expect_error([&] { s.set_contiguous(96); }, {"does not split over 5 ranks"});
}

TEST(Sampler, SetEpochReshufflesTheSameSet) {
  DistributedSampler s(1000, 1, 0, 3);
  EXPECT_EQ(s.epoch(), 0u);
  Indices a = s.indices();
  EXPECT_EQ(a, s.indices());  // same (seed, epoch): same order
  s.set_epoch(1);
  EXPECT_EQ(s.epoch(), 1u);
  Indices b = s.indices();
  EXPECT_NE(a, b);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
  DistributedSampler other(1000, 1, 0, 3);
  other.set_epoch(1);
  EXPECT_EQ(other.indices(), s.indices());
  DistributedSampler reseeded(1000, 1, 0, 4);
  reseeded.set_epoch(1);
  EXPECT_NE(reseeded.indices(), s.indices());
}

TEST(Sampler, NoShuffleIsIdentityOrder) {
  const auto sh = shards(10, 4, 1, 5, /*shuffle=*/false);
  EXPECT_EQ(sh[0], Indices({0, 4}));
  EXPECT_EQ(sh[1], Indices({1, 5}));
  EXPECT_EQ(sh[2], Indices({2, 6}));
  EXPECT_EQ(sh[3], Indices({3, 7}));
  EXPECT_EQ(shards(10, 1, 1, 5, false)[0], iota(10));
}

TEST(Sampler, WithoutDropLastPadsLikePyTorch) {
  // torch DistributedSampler(range(10), num_replicas=4, shuffle=False,
  // drop_last=False): ceil(10/4) = 3 each, padded with indices[:2].
  auto sh = shards(10, 4, 0, 0, false, false);
  EXPECT_EQ(sh[0], Indices({0, 4, 8}));
  EXPECT_EQ(sh[1], Indices({1, 5, 9}));
  EXPECT_EQ(sh[2], Indices({2, 6, 0}));
  EXPECT_EQ(sh[3], Indices({3, 7, 1}));
  // Padding longer than the data repeats it: range(2) over 5 replicas.
  sh = shards(2, 5, 0, 0, false, false);
  const Indices want = {0, 1, 0, 1, 0};
  for (int r = 0; r < 5; ++r) EXPECT_EQ(sh[r], Indices({want[r]})) << r;
  // Shuffled: the padding is the front of the permutation.
  const Indices perm = permutation(1003, 11, 0);
  sh = shards(1003, 4, 11, 0, true, false);
  Indices interleaved;
  for (size_t k = 0; k < sh[0].size(); ++k)
    for (int r = 0; r < 4; ++r) interleaved.push_back(sh[r][k]);
  ASSERT_EQ(interleaved.size(), 1004u);
  EXPECT_TRUE(std::equal(perm.begin(), perm.end(), interleaved.begin()));
  EXPECT_EQ(interleaved[1003], perm[0]);
  // Already divisible: no padding either way.
  EXPECT_EQ(shards(12, 4, 0, 0, true, false), shards(12, 4, 0, 0, true, true));
}

TEST(Sampler, GlobalStepIsTheSameForEveryWorldSize) {
  // Note [global step]: with global batch B = W * b, step t consumes
  // perm[t*B, (t+1)*B) whatever W is, and every W has as many steps.
  const int64_t B = 12;
  for (int64_t n : {1000, 1003}) {
    for (uint64_t epoch : {0, 1}) {
      const Indices perm = permutation(n, 17, epoch);
      for (int w = 1; w <= 4; ++w) {
        const int64_t b = B / w;
        const auto sh = shards(n, w, 17, epoch);
        const int64_t steps = int64_t(sh[0].size()) / b;  // the loader drops the partial batch
        EXPECT_EQ(steps, n / B) << "n=" << n << " w=" << w;
        for (int64_t t = 0; t < steps; ++t) {
          std::set<int64_t> got;
          for (int r = 0; r < w; ++r)
            got.insert(sh[r].begin() + t * b, sh[r].begin() + (t + 1) * b);
          const std::set<int64_t> want(perm.begin() + t * B, perm.begin() + (t + 1) * B);
          ASSERT_EQ(got, want) << "n=" << n << " w=" << w << " step " << t;
        }
      }
    }
  }
}

TEST(Sampler, TooSmallDatasetGivesNoSamplesWithDropLast) {
  DistributedSampler s(3, 4, 3, 0);
  EXPECT_EQ(s.num_samples(), 0);
  EXPECT_TRUE(s.indices().empty());
  DistributedSampler empty(0, 2, 1, 0, true, false);
  EXPECT_EQ(empty.num_samples(), 0);
  EXPECT_TRUE(empty.indices().empty());
}

TEST(Sampler, RejectsBadWorld) {
  expect_error([] { DistributedSampler(10, 0, 0, 0); }, {"world size 0"});
  expect_error([] { DistributedSampler(10, 4, 4, 0); }, {"rank 4", "[0, 4)"});
  expect_error([] { DistributedSampler(10, 4, -1, 0); }, {"rank -1"});
  expect_error([] { DistributedSampler(-1, 4, 0, 0); }, {"dataset size -1"});
  expect_error([] { eval_shard(10, 0, 0); }, {"world size 0"});
  expect_error([] { eval_shard(10, 2, 2); }, {"rank 2"});
}

TEST(EvalShard, CoversEverySampleOnce) {
  for (int64_t n : {0, 1, 5, 594, 1003}) {
    for (int w = 1; w <= 5; ++w) {
      std::vector<int> seen(n);
      for (int r = 0; r < w; ++r) {
        const Indices mine = eval_shard(n, w, r);
        EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
        for (int64_t i : mine) {
          ASSERT_TRUE(i >= 0 && i < n);
          EXPECT_EQ(i % w, r);
          ++seen[i];
        }
      }
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(seen[i], 1) << "n=" << n << " w=" << w << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace ddp::data
