// Loader: the right samples in the right order, a clean stop at any point,
// and errors of the prefetch thread surfacing in next().
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <thread>

#include "ddp/data/loader.hpp"
#include "ddp/data/sampler.hpp"
#include "test_util.hpp"

namespace ddp::data {
namespace {

using testing::expect_error;
using Indices = std::vector<int64_t>;

// n samples of 2x3 pixels; sample i holds 100 i + j at pixel j and label i % 10,
// so every value in a batch tells where it came from.
Dataset indexed(int64_t n) {
  Dataset d;
  d.n = n;
  d.c = 1;
  d.h = 2;
  d.w = 3;
  d.source = "indexed";
  for (int64_t i = 0; i < n; ++i) {
    for (int j = 0; j < 6; ++j) d.images.push_back(float(100 * i + j));
    d.labels.push_back(int32_t(i % 10));
  }
  return d;
}

void expect_batch(const Batch& b, const Indices& want) {
  ASSERT_EQ(b.size, int(want.size()));
  ASSERT_EQ(b.x.size(), want.size() * 6);
  ASSERT_EQ(b.y.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(b.y[k], want[k] % 10);
    for (int j = 0; j < 6; ++j) ASSERT_EQ(b.x[k * 6 + j], float(100 * want[k] + j)) << k;
  }
}

Indices iota_like(int64_t n) {
  Indices v;
  for (int64_t i = 0; i < n; ++i) v.push_back(i);
  return v;
}

std::vector<Indices> drain(Loader& l) {
  std::vector<Indices> out;
  Batch b;
  while (l.next(b)) {
    Indices ids;
    for (int k = 0; k < b.size; ++k) ids.push_back(int64_t(b.x[k * 6]) / 100);
    out.push_back(ids);
  }
  return out;
}

// Fails the whole test binary rather than hang when fn does not return:
// a deadlocked join would otherwise only show as a CTest timeout.
void finishes_within(std::chrono::seconds limit, std::function<void()> fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  std::thread([fn = std::move(fn), done] {
    try {
      fn();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (f.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "FATAL: did not finish within %llds (deadlock?)\n",
                 static_cast<long long>(limit.count()));
    std::_Exit(1);
  }
  f.get();  // an exception of fn fails the test here
}

TEST(Loader, YieldsTheIndexedSamplesInOrder) {
  const Dataset d = indexed(50);
  const Indices order = permutation(50, 3, 0);
  Loader l(d, order, 8);
  EXPECT_EQ(l.num_batches(), 6);
  EXPECT_EQ(l.first_batch(), 0);
  Batch b;
  for (int t = 0; t < 6; ++t) {
    ASSERT_TRUE(l.next(b));
    expect_batch(b, Indices(order.begin() + 8 * t, order.begin() + 8 * (t + 1)));
  }
  EXPECT_FALSE(l.next(b));  // the 2 left over are dropped
  EXPECT_FALSE(l.next(b));
}

TEST(Loader, KeepsThePartialBatchWithoutDropLast) {
  const Dataset d = indexed(50);
  Loader l(d, permutation(50, 3, 0), 8, /*drop_last=*/false);
  EXPECT_EQ(l.num_batches(), 7);
  const auto got = drain(l);
  ASSERT_EQ(got.size(), 7u);
  EXPECT_EQ(got.back().size(), 2u);
  const Indices order = permutation(50, 3, 0);
  EXPECT_EQ(got.back(), Indices(order.end() - 2, order.end()));
}

TEST(Loader, ExactMultipleHasNoPartialBatch) {
  const Dataset d = indexed(48);
  for (bool drop : {true, false}) {
    Loader l(d, permutation(48, 1, 0), 8, drop);
    EXPECT_EQ(l.num_batches(), 6);
    EXPECT_EQ(drain(l).size(), 6u);
  }
}

TEST(Loader, StartsAtFirstBatch) {
  const Dataset d = indexed(50);
  const Indices order = permutation(50, 3, 1);
  Loader full(d, order, 8);
  const auto all = drain(full);
  for (int64_t first : {0, 1, 5, 6}) {
    Loader l(d, order, 8, true, first);
    EXPECT_EQ(l.num_batches(), 6);
    EXPECT_EQ(l.first_batch(), first);
    EXPECT_EQ(drain(l), std::vector<Indices>(all.begin() + first, all.end())) << first;
  }
  expect_error([&] { Loader(d, order, 8, true, 7); }, {"first batch 7", "6 batches"});
  expect_error([&] { Loader(d, order, 8, true, -1); }, {"first batch -1"});
}

TEST(Loader, AnyPrefetchDepthGivesTheSameBatches) {
  const Dataset d = indexed(200);
  const Indices order = permutation(200, 4, 0);
  Loader ref(d, order, 7, false, 0, 1);
  const auto want = drain(ref);
  for (int prefetch : {2, 3, 8, 100}) {
    Loader l(d, order, 7, false, 0, prefetch);
    EXPECT_EQ(drain(l), want) << prefetch;
  }
}

TEST(Loader, ReusesItsBuffers) {
  // After warm-up the batches circulate among prefetch + 1 buffers (the ring's
  // and the caller's): no allocation per batch.
  const Dataset d = indexed(1000);
  const int prefetch = 2;
  Loader l(d, permutation(1000, 0, 0), 10, true, 0, prefetch);
  Batch b;
  std::set<const float*> xs;
  std::set<const int32_t*> ys;
  for (int t = 0; l.next(b); ++t) {
    if (t >= 10) {
      xs.insert(b.x.data());
      ys.insert(b.y.data());
    }
  }
  EXPECT_LE(xs.size(), size_t(prefetch + 1));
  EXPECT_LE(ys.size(), size_t(prefetch + 1));
}

TEST(Loader, EmptyEpoch) {
  const Dataset d = indexed(5);
  Loader l(d, {}, 4);
  EXPECT_EQ(l.num_batches(), 0);
  Batch b;
  EXPECT_FALSE(l.next(b));
  Loader short_one(d, {0, 1, 2}, 4);  // fewer than a batch, dropped
  EXPECT_EQ(short_one.num_batches(), 0);
  EXPECT_FALSE(short_one.next(b));
}

TEST(Loader, DestroyedMidEpochDoesNotHang) {
  const Dataset d = indexed(5000);
  for (int prefetch : {1, 2, 4}) {
    finishes_within(std::chrono::seconds(20), [&] {
      { Loader untouched(d, permutation(5000, 0, 0), 4, true, 0, prefetch); }
      {
        Loader l(d, permutation(5000, 0, 0), 4, true, 0, prefetch);
        Batch b;
        ASSERT_TRUE(l.next(b));
        ASSERT_TRUE(l.next(b));
        // Give the thread time to fill the queue and block on it.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      {
        Loader l(d, permutation(5000, 0, 0), 4, true, 0, prefetch);
        Batch b;
        for (int i = 0; i < 100; ++i) ASSERT_TRUE(l.next(b));
      }
    });
  }
}

TEST(Loader, ErrorInThePrefetchThreadSurfacesInNext) {
  const Dataset d = indexed(50);
  Indices order = permutation(50, 0, 0);
  order[17] = 50;  // in batch 2 of 8
  finishes_within(std::chrono::seconds(20), [&] {
    Loader l(d, order, 8);
    Batch b;
    ASSERT_TRUE(l.next(b));  // batches before the bad one still arrive
    expect_batch(b, Indices(order.begin(), order.begin() + 8));
    // Let the thread reach the bad batch while batch 1 still waits in the queue.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(l.next(b));
    expect_batch(b, Indices(order.begin() + 8, order.begin() + 16));
    expect_error([&] { l.next(b); }, {"index 50 at position 17", "indexed", "50 samples"});
    expect_error([&] { l.next(b); }, {"index 50"});  // and again, never a hang or false
  });
  order[17] = -3;
  Loader l(d, order, 8);
  Batch b;
  l.next(b);
  l.next(b);
  expect_error([&] { l.next(b); }, {"index -3"});
}

TEST(Loader, RejectsBadArguments) {
  const Dataset d = indexed(10);
  expect_error([&] { Loader(d, iota_like(10), 0); }, {"batch size 0"});
  expect_error([&] { Loader(d, iota_like(10), 2, true, 0, 0); }, {"prefetch 0"});
  Dataset broken = indexed(10);
  broken.labels.pop_back();
  expect_error([&] { Loader(broken, iota_like(10), 2); }, {"inconsistent"});
}

TEST(Loader, WithTheSamplerEveryGlobalStepIsTheSameWhateverTheWorldSize) {
  // Note [global step] end to end: ranks' loaders together yield
  // perm[t*B, (t+1)*B) at step t, as many steps for every W.
  const Dataset d = indexed(1003);
  const int B = 12;
  const Indices perm = permutation(1003, 21, 2);
  for (int w = 1; w <= 4; ++w) {
    std::vector<std::vector<Indices>> per_rank;
    for (int r = 0; r < w; ++r) {
      DistributedSampler s(d.n, w, r, 21);
      s.set_epoch(2);
      Loader l(d, s.indices(), B / w);
      per_rank.push_back(drain(l));
      EXPECT_EQ(int64_t(per_rank.back().size()), d.n / B) << "w=" << w;
    }
    for (size_t t = 0; t < per_rank[0].size(); ++t) {
      std::set<int64_t> got;
      for (int r = 0; r < w; ++r) got.insert(per_rank[r][t].begin(), per_rank[r][t].end());
      ASSERT_EQ(got, std::set<int64_t>(perm.begin() + t * B, perm.begin() + (t + 1) * B))
          << "w=" << w << " step " << t;
    }
  }
}

}  // namespace
}  // namespace ddp::data
