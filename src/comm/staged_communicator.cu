// The mpi backend on GPU memory (device_communicator.hpp): each all-reduce is
// copied to pinned host memory, reduced by the MPI backend, and copied back.
// It is what ranks that share a GPU use (NCCL refuses two ranks on one GPU),
// and what runs where NCCL cannot.
//
// Note [staging thread]: the copies and the MPI wait happen on a thread of
// our own, one job at a time in issue order, so that allreduce_async returns
// at once and backward keeps computing while a bucket is on the wire (Note
// [device all-reduce order]). Its copies go on a stream of its own: the
// context's copy stream belongs to the loader. Because jobs run one after
// another and all their copies are on that one stream, one pinned buffer,
// grown to the largest bucket, serves them all: a job's copy to host is
// ordered after the previous job's copy back.
//
// Note [two mpi communicators]: the staging thread's all-reduces and the
// caller's blocking collectives each have an MPI communicator of their own.
// Each one's timeout is then set only by the thread that uses it (the base
// class's timeout is a plain field, not safe to set from one thread while
// another reads it).
#ifdef __linux__
#include <sys/prctl.h>  // PR_SET_TIMERSLACK
#endif

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/device_communicator.hpp"  // DeviceCommunicator, make_mpi_communicator
#include "ddp/core/error.hpp"                // ddp::Error, DDP_CHECK
#include "cuda_comm_util.hpp"                // bounded, quietly, EventPool, stream_done
#include "ddp/runtime/cuda_check.hpp"        // DDP_CUDA_CHECK

namespace ddp::comm {
namespace {

using cuda_util::bounded;
using cuda_util::EventPool;
using cuda_util::quietly;
using cuda_util::stream_done;

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Between two looks at a stream or an MPI request: little latency added to a
// step, and the core left to the caller's compute and to the MPI thread.
constexpr auto kPollSleep = std::chrono::microseconds(50);
// wait() allows the job's copy to host and its MPI all-reduce a timeout each
// (both bounded by it on the staging thread), plus this for the rest.
constexpr milliseconds kWaitMargin = std::chrono::seconds(30);

std::string timeout_message(const std::string& what, milliseconds t) {
  return detail::concat(what, " did not complete within ", format_duration(t),
                        ": another rank may have failed or be stuck");
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

// One all-reduce, from the caller's thread to the staging thread and back.
// `finished` and `error` are guarded by Shared::mu; the rest is set before
// the job is queued and only read after.
struct Job {
  std::string desc;
  float* data = nullptr;
  size_t count = 0;
  ReduceOp op = ReduceOp::Sum;
  Wire wire = Wire::F32;    // what the host all-reduce sends (the copies stay fp32)
  milliseconds timeout{0};  // the communicator's, read on the caller's thread
  std::shared_ptr<EventPool> pool;
  cudaEvent_t ready = nullptr;  // on compute: the gradients are written
  cudaEvent_t done = nullptr;   // on the staging stream: the result is back on the GPU
  bool finished = false;
  std::exception_ptr error;

  ~Job() {
    if (pool) {
      pool->put(ready);
      pool->put(done);
    }
  }
};

// What the Works and the staging thread share.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;  // a job finished, or one was queued, or stop
  std::deque<std::shared_ptr<Job>> queue;
  bool stop = false;

  void finish(Job& job, std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lk(mu);
      job.finished = true;
      job.error = std::move(error);
    }
    cv.notify_all();
  }
};

class StagedWork final : public Work {
 public:
  StagedWork(std::shared_ptr<Shared> shared, std::shared_ptr<Job> job, cudaStream_t compute, int device)
      : shared_(std::move(shared)), job_(std::move(job)), compute_(compute), device_(device) {}

  void wait() override {
    const milliseconds limit = bounded(2 * bounded(job_->timeout) + kWaitMargin);
    {
      std::unique_lock<std::mutex> lk(shared_->mu);
      if (!shared_->cv.wait_for(lk, limit, [&] { return job_->finished; }))
        throw Error(timeout_message(detail::concat(job_->desc, " (mpi, staged through host memory)"),
                                    limit));
      if (job_->error) std::rethrow_exception(job_->error);
    }
    // Note [device all-reduce order]: compute waits for the copy back.
    DDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, job_->done, 0));
  }

  bool done() override {
    {
      std::lock_guard<std::mutex> lk(shared_->mu);
      if (!job_->finished) return false;
      if (job_->error) return true;  // wait() reports it
    }
    // The watchdog's thread asks too: on its first CUDA call a thread with
    // no device set would make itself a context on GPU 0.
    DDP_CUDA_CHECK(cudaSetDevice(device_));
    const cudaError_t e = cudaEventQuery(job_->done);
    if (e == cudaErrorNotReady) return false;
    DDP_CUDA_CHECK(e);
    return true;
  }

 private:
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Job> job_;
  cudaStream_t compute_;
  int device_;
};

class StagedMpiCommunicator final : public cuda_util::HostCollectives {
 public:
  StagedMpiCommunicator(const World& world, cuda::Context& ctx, std::unique_ptr<Communicator> host)
      : HostCollectives(std::move(host)),  // Note [two mpi communicators]
        ctx_(ctx),
        reduce_mpi_(make_mpi_communicator(world)),  // Note [two mpi communicators]
        rank_(world.rank),
        size_(world.size),
        shared_(std::make_shared<Shared>()),
        pool_(std::make_shared<EventPool>()) {
    DDP_CUDA_CHECK(cudaSetDevice(ctx_.device()));
    DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (size_ > 1) thread_ = std::thread([this] { run(); });
  }

  ~StagedMpiCommunicator() override {
    // Never throws: this runs after the run's result, or while an earlier
    // error is being handled.
    {
      std::lock_guard<std::mutex> lk(shared_->mu);
      shared_->stop = true;
    }
    shared_->cv.notify_all();
    if (thread_.joinable()) thread_.join();
    std::deque<std::shared_ptr<Job>> left;
    {
      std::lock_guard<std::mutex> lk(shared_->mu);
      left.swap(shared_->queue);
    }
    for (auto& job : left)
      shared_->finish(*job, std::make_exception_ptr(Error(detail::concat(
                                job->desc, " was not started: the communicator was destroyed"))));
    // Its destructor ends its own thread; a request it abandons keeps its
    // communicator (mpi_communicator.cpp, Note [abandoned requests]).
    reduce_mpi_.reset();
    // The last copy back may still be running. If the GPU does not finish
    // it in time, or an all-reduce was abandoned mid-flight (MPI may still
    // write into the buffer), the buffer and stream stay: the job is ending.
    bool idle = false;
    quietly([&] { idle = stream_done(stream_, Clock::now() + kWaitMargin, kPollSleep); });
    if (!idle || abandoned_) return;
    if (pinned_) quietly([&] { DDP_CUDA_CHECK(cudaFreeHost(pinned_)); });
    quietly([&] { DDP_CUDA_CHECK(cudaStreamDestroy(stream_)); });
  }

  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op,
                                        std::string what) override {
    return allreduce_compressed_async(data, count, op, Wire::F32, std::move(what));
  }

  std::shared_ptr<Work> allreduce_compressed_async(float* data, size_t count, ReduceOp op, Wire wire,
                                                   std::string what) override {
    auto job = std::make_shared<Job>();
    job->desc = allreduce_label(what, count, wire);
    DDP_CHECK(data != nullptr || count == 0, job->desc, ": null buffer");
    // With one rank the sum and the mean are the buffer itself.
    if (size_ == 1 || count == 0) return std::make_shared<DoneWork>();
    job->data = data;
    job->count = count;
    job->op = op;
    job->wire = wire;
    job->timeout = timeout();
    job->pool = pool_;
    job->ready = pool_->get();
    job->done = pool_->get();
    // Note [device all-reduce order]: the copy to host waits for this.
    DDP_CUDA_CHECK(cudaEventRecord(job->ready, ctx_.compute()));
    {
      std::lock_guard<std::mutex> lk(shared_->mu);
      DDP_CHECK(!shared_->stop, job->desc, ": the communicator is shutting down");
      shared_->queue.push_back(job);
    }
    shared_->cv.notify_all();
    return std::make_shared<StagedWork>(shared_, job, ctx_.compute(), ctx_.device());
  }

  // --deterministic's integer sums: through host memory on the caller's
  // thread, by its MPI communicator, done when this returns. Backward starts
  // one for each op it has finished (Note [overlapped sums],
  // deterministic/exact_sum.hpp); here each waits for the compute stream and the
  // ranks, so on this backend they do not overlap backward.
  std::shared_ptr<Work> allreduce_int64_async(int64_t* data, size_t count, std::string what) override {
    return sum_through_host(data, count, "int64", what, [&](int64_t* h) { host().allreduce_int64(h, count, what); });
  }
  // SyncBatchNorm's sums, the same way.
  std::shared_ptr<Work> allreduce_doubles_async(double* data, size_t count, std::string what) override {
    return sum_through_host(data, count, "double", what,
                            [&](double* h) { host().allreduce_doubles(h, count, /*max=*/false, what); });
  }

  void synchronize(cudaStream_t stream, const std::string& what) override {
    const milliseconds limit = timeout();
    if (!stream_done(stream, Clock::now() + bounded(limit), kPollSleep))
      throw Error(timeout_message(detail::concat(what, " (mpi)"), limit));
  }

 private:
  // count values of device memory summed in place by sum(host copy), done
  // when this returns.
  template <class T, class Sum>
  std::shared_ptr<Work> sum_through_host(T* data, size_t count, const char* type, const std::string& what,
                                         const Sum& sum) {
    const std::string desc = detail::concat(what, " (", format_bytes(count * sizeof(T)), " as ", type, ")");
    DDP_CHECK(data != nullptr || count == 0, desc, ": null buffer");
    if (size_ == 1 || count == 0) return std::make_shared<DoneWork>();
    std::vector<T> h(count);
    synchronize(ctx_.compute(), desc + ": the sums");  // Note [bounded copies to the host]
    DDP_CUDA_CHECK(cudaMemcpyAsync(h.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost, ctx_.compute()));
    sum(h.data());
    // From pageable memory: returns once h is staged, so h may go.
    DDP_CUDA_CHECK(cudaMemcpyAsync(data, h.data(), count * sizeof(T), cudaMemcpyHostToDevice, ctx_.compute()));
    return std::make_shared<DoneWork>();
  }

  // Why a wait on the staging thread ended without its result.
  struct Stopped {};

  // Note [staging thread].
  void run() {
#ifdef __linux__
    // Our polls sleep 50 us; the default timer slack would make each 100 us.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
    std::exception_ptr broken;  // after a failure every later job fails too
    try {
      DDP_CUDA_CHECK(cudaSetDevice(ctx_.device()));
    } catch (...) {
      broken = std::current_exception();
    }
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lk(shared_->mu);
        shared_->cv.wait(lk, [&] { return shared_->stop || !shared_->queue.empty(); });
        if (shared_->stop) return;  // the destructor fails what is left
        job = shared_->queue.front();
        shared_->queue.pop_front();
      }
      if (broken) {
        shared_->finish(*job, std::make_exception_ptr(Error(detail::concat(
                                  job->desc, " was not started: an earlier all-reduce failed: ",
                                  message_of(broken)))));
        continue;
      }
      try {
        execute(*job);
        shared_->finish(*job, nullptr);
      } catch (const Stopped&) {
        shared_->finish(*job, std::make_exception_ptr(Error(detail::concat(
                                  job->desc, " did not complete: the communicator was destroyed"))));
        return;
      } catch (const std::exception& e) {
        // MPI's errors and our timeouts name the job already; CUDA's do not.
        const std::string msg = e.what();
        broken = std::make_exception_ptr(Error(
            msg.compare(0, job->desc.size(), job->desc) == 0
                ? msg
                : detail::concat(job->desc, " failed (mpi, staged through host memory): ", msg)));
        shared_->finish(*job, broken);
      } catch (...) {
        broken = std::current_exception();
        shared_->finish(*job, broken);
      }
    }
  }

  void execute(Job& job) {
    const size_t bytes = job.count * sizeof(float);
    grow_pinned(bytes, job);
    DDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, job.ready, 0));
    DDP_CUDA_CHECK(cudaMemcpyAsync(pinned_, job.data, bytes, cudaMemcpyDeviceToHost, stream_));
    wait_stream(job, "the copy to host");

    reduce_mpi_->set_timeout(job.timeout);
    auto w = reduce_mpi_->allreduce_compressed_async(static_cast<float*>(pinned_), job.count, job.op, job.wire,
                                                     job.desc);
    const auto deadline = Clock::now() + bounded(job.timeout);
    while (!w->done()) {
      if (stopping()) {
        abandoned_ = true;  // MPI may still write into pinned_
        throw Stopped{};
      }
      if (Clock::now() >= deadline) {
        abandoned_ = true;
        throw Error(timeout_message(job.desc, job.timeout));
      }
      std::this_thread::sleep_for(kPollSleep);
    }
    w->wait();  // done: returns at once, or throws its error

    // Not waited for here: the next job's copy to host is behind it on the
    // same stream, and wait() orders compute after `done`.
    DDP_CUDA_CHECK(cudaMemcpyAsync(job.data, pinned_, bytes, cudaMemcpyHostToDevice, stream_));
    DDP_CUDA_CHECK(cudaEventRecord(job.done, stream_));
  }

  // Note [staging thread]: one buffer, grown to the largest bucket; after
  // the first step it is never reallocated.
  void grow_pinned(size_t bytes, Job& job) {
    if (bytes <= pinned_bytes_) return;
    if (pinned_) {
      wait_stream(job, "the previous copy back, before growing the staging buffer");
      DDP_CUDA_CHECK(cudaFreeHost(pinned_));
      pinned_ = nullptr;
      pinned_bytes_ = 0;
    }
    try {
      DDP_CUDA_CHECK(cudaMallocHost(&pinned_, bytes));
    } catch (const std::exception& e) {
      DDP_FAIL("could not allocate ", format_bytes(bytes), " of pinned host memory to stage ",
               job.desc, ": ", e.what());
    }
    pinned_bytes_ = bytes;
  }

  // The staging stream is done, bounded by the job's timeout; the caller's
  // compute feeds it (the copy waits for `ready`), so a stuck GPU ends here.
  void wait_stream(const Job& job, const char* step) {
    const auto stop_check = [this] {
      if (stopping()) throw Stopped{};
    };
    if (!stream_done(stream_, Clock::now() + bounded(job.timeout), kPollSleep, stop_check))
      throw Error(timeout_message(detail::concat(job.desc, ": ", step), job.timeout));
  }

  bool stopping() {
    std::lock_guard<std::mutex> lk(shared_->mu);
    return shared_->stop;
  }

  cuda::Context& ctx_;
  std::unique_ptr<Communicator> reduce_mpi_;  // staging thread only
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<EventPool> pool_;
  cudaStream_t stream_ = nullptr;

  // Staging thread only (the destructor reads them after the join).
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  bool abandoned_ = false;

  std::thread thread_;
};

}  // namespace

std::unique_ptr<DeviceCommunicator> make_staged_mpi_communicator(const World& world, cuda::Context& ctx,
                                                                 std::unique_ptr<Communicator> host) {
  return std::make_unique<StagedMpiCommunicator>(world, ctx, std::move(host));
}

}  // namespace ddp::comm
