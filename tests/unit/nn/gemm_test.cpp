// SerialBlas: OpenBLAS single-threaded while guards live, its count back
// after; and what the layers rely on it for, OpenBLAS called from several
// threads at once (Note [serial OpenBLAS]).
#include <cblas.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "ddp/nn/cpu/gemm.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"
#include "grad_check.hpp"

namespace ddp::nn {
namespace {

// Restores OpenBLAS's thread count when a test ends.
struct KeepBlasThreads {
  int saved = openblas_get_num_threads();
  ~KeepBlasThreads() { openblas_set_num_threads(saved); }
};

TEST(SerialBlas, OneThreadWhileAnyGuardLives) {
  KeepBlasThreads keep;
  openblas_set_num_threads(3);
  {
    cpu::SerialBlas outer;
    EXPECT_EQ(openblas_get_num_threads(), 1);
    EXPECT_EQ(cpu::blas_threads(), 3);
    EXPECT_EQ(default_threads(), 3);
    {
      cpu::SerialBlas inner;
      EXPECT_EQ(openblas_get_num_threads(), 1);
    }
    EXPECT_EQ(openblas_get_num_threads(), 1);
  }
  EXPECT_EQ(openblas_get_num_threads(), 3);
  EXPECT_EQ(cpu::blas_threads(), 3);

  // Guards on other threads, overlapping: the count is back after the last.
  std::atomic<int> entered{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&] {
      cpu::SerialBlas guard;
      entered.fetch_add(1);
      while (!release.load()) std::this_thread::yield();
    });
  while (entered.load() < 3) std::this_thread::yield();
  EXPECT_EQ(openblas_get_num_threads(), 1);
  release.store(true);
  for (auto& t : threads) t.join();
  EXPECT_EQ(openblas_get_num_threads(), 3);
}

// Single-threaded OpenBLAS called from several threads at once gives what the
// same calls give one after another, bit for bit (same shapes, same code).
// The shapes are LeNet's conv GEMMs: conv2's forward and input gradient
// (OpenBLAS packs their operands) and conv1's forward (its unpacked
// small-matrix kernels), with distinct operands and outputs per call.
TEST(SerialBlas, ConcurrentGemmsMatchSequential) {
  KeepBlasThreads keep;
  openblas_set_num_threads(2);
  struct Mnk {
    int m, n, k;
  };
  const Mnk shapes[] = {{50, 162, 500}, {20, 676, 9}, {500, 162, 50}};
  const int calls = 48;
  std::vector<std::vector<float>> a(calls), b(calls), want(calls), got(calls);
  for (int i = 0; i < calls; ++i) {
    const Mnk s = shapes[i % 3];
    a[i] = test::to_float(test::random_vec(size_t(s.m) * s.k, 100 + i));
    b[i] = test::to_float(test::random_vec(size_t(s.k) * s.n, 200 + i));
    want[i].assign(size_t(s.m) * s.n, 0.0f);
    got[i].assign(size_t(s.m) * s.n, 0.0f);
  }
  auto run = [&](int i, std::vector<float>& c) {
    const Mnk s = shapes[i % 3];
    cpu::gemm(false, false, s.m, s.n, s.k, 1.0f, a[i].data(), s.k, b[i].data(), s.n, 0.0f,
              c.data(), s.n);
  };
  {
    cpu::SerialBlas serial;
    for (int i = 0; i < calls; ++i) run(i, want[i]);
  }
  ThreadPool pool(4);
  for (int rep = 0; rep < 5; ++rep) {
    cpu::SerialBlas serial;
    pool.parallel_for(calls, [&](int64_t i, int) { run(int(i), got[size_t(i)]); });
    for (int i = 0; i < calls; ++i) ASSERT_EQ(got[i], want[i]) << "call " << i << ", rep " << rep;
  }
}

}  // namespace
}  // namespace ddp::nn
