// ThreadPool: every item exactly once, errors surface, any size works.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"

namespace ddp::nn {
namespace {

TEST(ThreadPool, RunsEveryItemOnceOnAValidThread) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad_t{0};
      pool.parallel_for(n, [&](int64_t i, int t) {
        hits[size_t(i)].fetch_add(1);
        if (t < 0 || t >= threads) bad_t.fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "item " << i;
      EXPECT_EQ(bad_t.load(), 0);
    }
  }
}

TEST(ThreadPool, NoTwoItemsShareAThreadAtOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> busy(3);
  std::atomic<int> overlaps{0};
  for (int rep = 0; rep < 20; ++rep)
    pool.parallel_for(200, [&](int64_t, int t) {
      if (busy[size_t(t)].fetch_add(1) != 0) overlaps.fetch_add(1);
      volatile double x = 0;
      for (int k = 0; k < 200; ++k) x = x + k;
      busy[size_t(t)].fetch_sub(1);
    });
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100,
                                 [](int64_t i, int) {
                                   if (i == 37) throw std::runtime_error("item 37");
                                 }),
               std::runtime_error);
  std::atomic<int> count{0};
  pool.parallel_for(50, [&](int64_t, int) { count.fetch_add(1); });
  EXPECT_EQ(count.load(), 50);
}

TEST(ThreadPool, RejectsZeroThreads) { EXPECT_THROW(ThreadPool(0), Error); }

}  // namespace
}  // namespace ddp::nn
