// ThreadPool: fork-join with late workers left behind (Note [late workers]).
#include "ddp/nn/cpu/thread_pool.hpp"

#include <algorithm>
#include <system_error>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define DDP_CPU_RELAX() _mm_pause()
#else
#define DDP_CPU_RELAX() ((void)0)
#endif

namespace ddp::nn {

namespace {
// Spin this many rounds before sleeping: a training step runs its parallel
// loops back to back, and waking a sleeping thread costs more than the
// shorter loops take.
constexpr int kSpinRounds = 2000;  // ~0.1 ms with pause at ~100 cycles
}  // namespace

int default_threads() { return std::max(1, cpu::blas_threads()); }

ThreadPool::ThreadPool(int threads) {
  DDP_CHECK(threads >= 1, "ThreadPool: need at least one thread, got ", threads);
  try {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { worker(t); });
  } catch (const std::system_error& e) {
    // The destructor does not run for a constructor that throws, and a
    // joinable std::thread destroyed unjoined ends the process: stop and
    // join the workers started, then say what failed.
    const size_t started = workers_.size();
    shut_down();
    DDP_FAIL("could not start thread ", started + 1, " of ", threads, " (", e.what(),
             "): the process or user may be at its thread limit (ulimit -u)");
  }
}

void ThreadPool::shut_down() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() { shut_down(); }

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int)>& body) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  const std::function<void(int)> job = [&](int t) {
    for (int64_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) {
      try {
        body(i, t);
      } catch (...) {
        failed.store(true);
        throw;
      }
    }
  };
  if (workers_.empty() || n == 1) {
    job(0);
    return;
  }
  run(job);
}

void ThreadPool::run(const std::function<void(int)>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    error_ = nullptr;
    closed_ = false;
    generation_.fetch_add(1);
  }
  start_cv_.notify_all();
  std::exception_ptr mine;
  try {
    job(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::exception_ptr theirs;
  {
    std::unique_lock<std::mutex> lock(mu_);
    closed_ = true;
    done_cv_.wait(lock, [this] { return joined_ == 0; });
    job_ = nullptr;
    theirs = error_;
  }
  if (mine) std::rethrow_exception(mine);
  if (theirs) std::rethrow_exception(theirs);
}

void ThreadPool::worker(int t) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpinRounds && generation_.load() == seen; ++i) DDP_CPU_RELAX();
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
      if (closed_) continue;  // woke too late: the caller finished this job alone
      job = job_;
      ++joined_;
    }
    try {
      (*job)(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (--joined_ == 0 && closed_) done_cv_.notify_one();
  }
}

}  // namespace ddp::nn
