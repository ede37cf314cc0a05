// plan_buckets: the partition Note [bucket order] promises, checked on
// hand-made and on random parameter lists.
#include <gtest/gtest.h>

#include <numeric>

#include "ddp/core/rng.hpp"
#include "ddp/reducer/reducer.hpp"

namespace ddp {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

// Every parameter in exactly one bucket, buckets contiguous and in order, no
// bucket over its cap unless it holds a single parameter.
void expect_partition(const std::vector<size_t>& numels, const std::vector<Bucket>& buckets,
                      size_t cap, size_t first_cap) {
  if (numels.empty()) {
    EXPECT_TRUE(buckets.empty());
    return;
  }
  ASSERT_FALSE(buckets.empty());
  size_t param = 0, offset = 0;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& b = buckets[k];
    SCOPED_TRACE("bucket " + std::to_string(k));
    EXPECT_EQ(b.first_param, param);
    EXPECT_EQ(b.begin, offset);
    ASSERT_LT(b.first_param, b.last_param) << "empty bucket";
    size_t n = 0, nonempty = 0;
    for (size_t p = b.first_param; p < b.last_param; ++p) {
      n += numels[p];
      nonempty += numels[p] > 0;
    }
    EXPECT_EQ(b.end - b.begin, n);
    const size_t limit = k == 0 ? first_cap : cap;
    if (nonempty > 1) {
      EXPECT_LE(n * sizeof(float), limit);
    }
    // Greedy: the next parameter did not fit (otherwise it would be here).
    if (k + 1 < buckets.size()) {
      EXPECT_GT((n + numels[b.last_param]) * sizeof(float), limit);
    }
    param = b.last_param;
    offset = b.end;
  }
  EXPECT_EQ(param, numels.size());
  EXPECT_EQ(offset, std::accumulate(numels.begin(), numels.end(), size_t(0)));
}

TEST(PlanBuckets, Empty) { EXPECT_TRUE(plan_buckets({}, 25 * kMiB, kMiB).empty()); }

TEST(PlanBuckets, HugeCapGivesOneBucketAfterTheSmallFirst) {
  // 4 params of 1 MiB of floats each; first cap 1 MiB holds exactly one.
  const std::vector<size_t> n(4, kMiB / 4);
  auto b = plan_buckets(n, 1024 * kMiB, kMiB);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].last_param, 1u);
  EXPECT_EQ(b[1].first_param, 1u);
  EXPECT_EQ(b[1].last_param, 4u);
  expect_partition(n, b, 1024 * kMiB, kMiB);
}

TEST(PlanBuckets, HugeFirstCapGivesOneBucket) {
  const std::vector<size_t> n = {10, 20, 30};
  auto b = plan_buckets(n, 1024 * kMiB, 1024 * kMiB);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].begin, 0u);
  EXPECT_EQ(b[0].end, 60u);
}

TEST(PlanBuckets, TinyCapGivesOneBucketPerParam) {
  const std::vector<size_t> n = {5, 1, 7, 3};
  auto b = plan_buckets(n, 1, 1);
  ASSERT_EQ(b.size(), n.size());
  for (size_t k = 0; k < b.size(); ++k) {
    EXPECT_EQ(b[k].first_param, k);
    EXPECT_EQ(b[k].last_param, k + 1);
  }
  expect_partition(n, b, 1, 1);
}

TEST(PlanBuckets, OversizeParamGetsItsOwnBucket) {
  // cap 100 floats: 40+40 fit, 500 alone, then 10+20 together.
  const std::vector<size_t> n = {40, 40, 500, 10, 20};
  auto b = plan_buckets(n, 400, 400);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].last_param, 2u);
  EXPECT_EQ(b[1].first_param, 2u);
  EXPECT_EQ(b[1].last_param, 3u);
  EXPECT_EQ(b[1].end - b[1].begin, 500u);
  EXPECT_EQ(b[2].first_param, 3u);
  EXPECT_EQ(b[2].last_param, 5u);
  expect_partition(n, b, 400, 400);
}

TEST(PlanBuckets, ExactFitStaysTogether) {
  const std::vector<size_t> n = {50, 50, 50};
  auto b = plan_buckets(n, 400, 400);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].end, 100u);
}

TEST(PlanBuckets, ZeroSizeParamsAreCovered) {
  const std::vector<size_t> n = {0, 3, 0, 0, 5, 0};
  auto b = plan_buckets(n, 12, 12);
  expect_partition(n, b, 12, 12);
}

TEST(PlanBuckets, RandomListsArePartitions) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> n(rng.below(40));
    for (auto& x : n) x = rng.below(4) == 0 ? rng.below(1 << 20) : rng.below(5000);
    const size_t cap = 4 * (1 + rng.below(300000));
    const size_t first = std::min(cap, 4 * (1 + rng.below(100000)));
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_partition(n, plan_buckets(n, cap, first), cap, first);
  }
}

}  // namespace
}  // namespace ddp
