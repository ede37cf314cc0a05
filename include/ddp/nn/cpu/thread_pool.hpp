// ddp::nn::ThreadPool: the threads a model's CPU kernels share a batch over.
//
// Why our own pool and not OpenBLAS's: the conv ops parallelise over images
// (im2col, GEMM and the pooling epilogue all in one pass per thread), which
// needs single-threaded GEMMs called from several threads at once: OpenBLAS
// made serial meanwhile (Note [serial OpenBLAS] in nn/cpu/gemm.hpp).
//
// Note [late workers]: work is handed out item by item from a shared counter,
// and the calling thread takes items too. A worker that wakes after the items
// are gone (its core was busy: another rank, another job) is not waited for.
// So a loop never runs slower than the calling thread alone would, where a
// static split would wait for the slowest core. Workers block between loops
// (after a short spin), so they cost nothing while OpenBLAS runs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ddp::nn {

class ThreadPool {
 public:
  // threads >= 1; the calling thread is one of them.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Runs body(i, t) once for every i in [0, n), on whichever threads are free
  // (t in [0, size()) names the thread: 0 is the caller; no two concurrent
  // calls share a t). Returns when all are done; rethrows the first exception
  // a body threw (the remaining items may then be skipped). Not reentrant.
  void parallel_for(int64_t n, const std::function<void(int64_t, int)>& body);

 private:
  void worker(int t);
  void shut_down();  // stops and joins the workers
  // Runs job(t) on the caller (t = 0) and on each worker that joins before the
  // caller is done with it (Note [late workers]).
  void run(const std::function<void(int)>& job);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  std::atomic<uint64_t> generation_{0};  // bumped per job; guarded by mu_ for writes
  const std::function<void(int)>* job_ = nullptr;  // guarded by mu_
  bool closed_ = true;   // no more workers may join the current job (mu_)
  int joined_ = 0;       // workers inside the current job (mu_)
  bool stop_ = false;    // (mu_)
  std::exception_ptr error_;  // (mu_)
};

// The thread count the CPU kernels use by default: OpenBLAS's, which World
// sets to this rank's share of the cores (as set outside any SerialBlas).
int default_threads();

}  // namespace ddp::nn
