// The nccl backend of DeviceCommunicator (device_communicator.hpp): gradient
// all-reduces on GPU memory with NCCL on the context's communication stream;
// the blocking host collectives through an MPI communicator it owns.
//
// Note [non-blocking nccl]: the communicator is made with config.blocking = 0
// so that no NCCL call can hang the host: a call may return ncclInProgress,
// and the operation is then only known to be set up (for a collective: on
// its stream) once ncclCommGetAsyncError stops saying ncclInProgress. We poll
// that against a deadline, and on an error or the deadline ncclCommAbort the
// communicator and throw: a dead or stuck peer ends the job with a message
// instead of a hang. After an abort every later use reports the first error.
//
// Every NCCL call is made on the thread that made the communicator (the
// trainer's): NCCL allows a communicator to be used from one thread at a time,
// and the shared state below has no lock for that reason.
#include <nccl.h>  // ncclAllReduce, ncclCommInitRankConfig, ncclCommGetAsyncError

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/device_communicator.hpp"  // DeviceCommunicator, make_mpi_communicator
#include "ddp/core/error.hpp"                // ddp::Error, DDP_CHECK
#include "ddp/core/half.hpp"                 // float_to_fp16, float_to_bf16 and back: 16-bit all-reduces
#include "cuda_comm_util.hpp"                // bounded, quietly, EventPool, stream_done
#include "ddp/runtime/cuda_check.hpp"        // DDP_CUDA_CHECK, DDP_NCCL_CHECK

namespace ddp::comm {
namespace {

using cuda_util::bounded;
using cuda_util::EventPool;
using cuda_util::quietly;
using cuda_util::stream_done;

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Between two looks at a stream or at NCCL's state: short enough to add
// little latency to a step, long enough to leave the core to other threads.
constexpr auto kPollSleep = std::chrono::microseconds(100);

// Note [16-bit all-reduce] (mpi_communicator.cpp), on the GPU: the floats,
// scaled by pre, rounded to 16 bits into a buffer of the comm stream, summed
// by NCCL in that format, widened back.
constexpr int kCastThreads = 256;

__global__ void to_16_kernel(const float* __restrict__ x, uint16_t* __restrict__ y, size_t n, float pre, bool bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = bf16 ? float_to_bf16(x[i] * pre) : float_to_fp16(x[i] * pre);
}

__global__ void from_16_kernel(const uint16_t* __restrict__ y, float* __restrict__ x, size_t n, bool bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = bf16 ? bf16_to_float(y[i]) : fp16_to_float(y[i]);
}

unsigned cast_grid(size_t n) { return unsigned(std::min<size_t>((n + kCastThreads - 1) / kCastThreads, 4096)); }
// How long the destructor lets ncclCommFinalize flush before aborting: it
// runs during error handling too, when peers may be gone.
constexpr milliseconds kFinalizeLimit = std::chrono::seconds(30);

const char* const kNcclHints =
    "likely causes: NCCL chose a network interface the other ranks cannot reach (set "
    "NCCL_SOCKET_IFNAME to the interface the nodes share), a firewall between the nodes, or a "
    "broken peer-to-peer or InfiniBand path (try NCCL_P2P_DISABLE=1 or NCCL_IB_DISABLE=1); rerun "
    "with NCCL_DEBUG=INFO to see what NCCL tried";

// NCCL's words for a failed state, with its last detailed message if any.
std::string nccl_error_text(ncclResult_t st, ncclComm_t comm) {
  std::string s = detail::concat(ncclGetErrorString(st), " (NCCL ", static_cast<int>(st), ")");
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += detail::concat(": ", last);
  return s;
}

// ncclCommGetAsyncError: ncclSuccess, ncclInProgress, or the error.
ncclResult_t async_state(ncclComm_t comm) {
  ncclResult_t st = ncclSuccess;
  DDP_NCCL_CHECK(ncclCommGetAsyncError(comm, &st));
  return st;
}

// What the communicator and its Works share: the NCCL handle while it is
// usable, and why it is not once it was aborted or destroyed. The watchdog's
// thread reads both (Work::done) while the caller's may fail the handle.
struct NcclState {
  std::atomic<ncclComm_t> comm{nullptr};

  // Aborts the communicator (Note [non-blocking nccl]) and throws `why`.
  [[noreturn]] void fail(std::string why) {
    if (ncclComm_t c = comm.exchange(nullptr)) {
      try {
        DDP_NCCL_CHECK(ncclCommAbort(c));
      } catch (const std::exception& e) {
        why += detail::concat("; then ncclCommAbort failed too: ", e.what());
      }
    }
    set_broken(why);
    throw Error(why);
  }

  void check_usable(const std::string& desc) const {
    if (!comm) DDP_FAIL(desc, ": the nccl communicator is unusable: ", why_broken());
  }

  // The first reason given is kept.
  void set_broken(const std::string& why) {
    std::lock_guard<std::mutex> lk(mu_);
    if (broken_.empty()) broken_ = why;
  }
  std::string why_broken() const {
    std::lock_guard<std::mutex> lk(mu_);
    return broken_.empty() ? "it was destroyed" : broken_;
  }

  // ncclSuccess or ncclInProgress; throws (after aborting) when NCCL
  // reported an asynchronous error.
  ncclResult_t check_async(const std::string& desc) {
    check_usable(desc);
    ncclResult_t st = ncclSuccess;
    try {
      st = async_state(comm);
    } catch (const std::exception& e) {
      fail(detail::concat(desc, " failed (nccl): ", e.what()));
    }
    if (st != ncclSuccess && st != ncclInProgress)
      fail(detail::concat(desc, " failed (nccl): ", nccl_error_text(st, comm), "; ", kNcclHints));
    return st;
  }

  // Polls until NCCL has set up what the last call started (Note
  // [non-blocking nccl]), at most `timeout`.
  void wait_in_progress(const std::string& desc, milliseconds timeout) {
    const auto deadline = Clock::now() + bounded(timeout);
    for (;;) {
      if (check_async(desc) == ncclSuccess) return;
      if (Clock::now() >= deadline)
        fail(detail::concat(desc, " (nccl) was not set up within ", format_duration(timeout),
                            ": another rank may have failed or be stuck"));
      std::this_thread::sleep_for(kPollSleep);
    }
  }

 private:
  mutable std::mutex mu_;
  std::string broken_;  // why comm is null; guarded by mu_
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> state, std::shared_ptr<EventPool> pool, cudaStream_t compute, int device,
           std::string desc)
      : state_(std::move(state)), pool_(std::move(pool)), compute_(compute), device_(device),
        desc_(std::move(desc)) {
    ready_ = pool_->get();
    done_ = pool_->get();
  }
  ~NcclWork() override {
    pool_->put(ready_);
    pool_->put(done_);
  }

  cudaEvent_t ready() const { return ready_; }
  cudaEvent_t done_event() const { return done_; }

  // Note [device all-reduce order]: the compute stream waits for the
  // collective; the host does not.
  void wait() override {
    state_->check_async(desc_);
    DDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
  }

  bool done() override {
    state_->check_usable(desc_);
    // The watchdog's thread asks too: on its first CUDA call a thread with
    // no device set would make itself a context on GPU 0.
    DDP_CUDA_CHECK(cudaSetDevice(device_));
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) return false;
    DDP_CUDA_CHECK(e);
    return true;
  }

 private:
  std::shared_ptr<NcclState> state_;
  std::shared_ptr<EventPool> pool_;
  cudaStream_t compute_;
  int device_;
  std::string desc_;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
};

class NcclCommunicator final : public cuda_util::HostCollectives {
 public:
  NcclCommunicator(const World& world, cuda::Context& ctx, milliseconds init_timeout,
                   std::unique_ptr<Communicator> host)
      : HostCollectives(std::move(host)),
        ctx_(ctx),
        rank_(world.rank),
        size_(world.size),
        state_(std::make_shared<NcclState>()),
        pool_(std::make_shared<EventPool>()) {
    DDP_CUDA_CHECK(cudaSetDevice(ctx_.device()));
    const std::string who = detail::concat("nccl: rank ", rank_, world.host.empty() ? "" : " on host ",
                                           world.host, " (GPU ", ctx_.device(), ")");
    ncclUniqueId id{};
    if (rank_ == 0) DDP_NCCL_CHECK(ncclGetUniqueId(&id));
    host_mpi_->set_timeout(init_timeout);
    host_mpi_->broadcast(&id, sizeof id, 0, "nccl: sending rank 0's unique id to every rank");
    host_mpi_->barrier("nccl: every rank has the unique id");

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // Note [non-blocking nccl]
    ncclComm_t comm = nullptr;
    std::string failure;
    try {
      DDP_NCCL_CHECK(ncclCommInitRankConfig(&comm, size_, id, rank_, &config));
      const auto deadline = Clock::now() + bounded(init_timeout);
      for (;;) {
        const ncclResult_t st = async_state(comm);
        if (st == ncclSuccess) break;
        if (st != ncclInProgress) {
          failure = nccl_error_text(st, comm);
          break;
        }
        if (Clock::now() >= deadline) {
          failure = detail::concat("not done within ", format_duration(init_timeout),
                                   ": another rank may have failed, or cannot be reached");
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (!failure.empty()) {
      if (comm) {
        try {
          DDP_NCCL_CHECK(ncclCommAbort(comm));
        } catch (const std::exception& e) {
          failure += detail::concat("; then ncclCommAbort failed too: ", e.what());
        }
      }
      DDP_FAIL(who, " could not join the NCCL communicator of ", size_, " ranks (timeout ",
               format_duration(init_timeout), "): ", failure, "; ", kNcclHints);
    }
    state_->comm = comm;
  }

  ~NcclCommunicator() override {
    if (wire_) quietly([&] { DDP_CUDA_CHECK(cudaFreeAsync(wire_, ctx_.comm())); });
    const ncclComm_t c = state_->comm.exchange(nullptr);
    state_->set_broken("the nccl communicator was destroyed");
    if (!c) return;  // aborted already
    bool clean = false;
    quietly([&] {
      DDP_CUDA_CHECK(cudaSetDevice(ctx_.device()));
      // Finalize flushes what is in flight; with a non-blocking communicator
      // it returns at once and we poll for the end, bounded.
      DDP_NCCL_CHECK(ncclCommFinalize(c));
      const auto deadline = Clock::now() + std::min(bounded(timeout()), kFinalizeLimit);
      for (;;) {
        const ncclResult_t st = async_state(c);
        if (st == ncclSuccess) break;
        if (st != ncclInProgress || Clock::now() >= deadline) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      DDP_NCCL_CHECK(ncclCommDestroy(c));
      clean = true;
    });
    // Not finalized in time, or failed: free it without the peers.
    if (!clean) quietly([&] { DDP_NCCL_CHECK(ncclCommAbort(c)); });
  }

  const char* backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op,
                                        std::string what) override {
    return allreduce_compressed_async(data, count, op, Wire::F32, std::move(what));
  }

  std::shared_ptr<Work> allreduce_compressed_async(float* data, size_t count, ReduceOp op, Wire wire,
                                                   std::string what) override {
    const bool half = wire != Wire::F32, bf16 = wire == Wire::BF16;
    const std::string desc = allreduce_label(what, count, wire);
    DDP_CHECK(data != nullptr || count == 0, desc, ": null buffer");
    state_->check_usable(desc);
    if (count == 0 || (!half && alone())) return std::make_shared<DoneWork>();
    auto w = ordered_work(desc);
    uint16_t* buf = nullptr;
    if (half) {
      buf = wire_buffer(count, desc);
      const float pre = op == ReduceOp::Avg ? 1.0f / float(size_) : 1.0f;
      to_16_kernel<<<cast_grid(count), kCastThreads, 0, ctx_.comm()>>>(data, buf, count, pre, bf16);
      DDP_CUDA_CHECK_LAUNCH(to_16_kernel);
    }
    issue(desc, [&] {
      if (half)
        DDP_NCCL_CHECK(ncclAllReduce(buf, buf, count, bf16 ? ncclBfloat16 : ncclFloat16, ncclSum, state_->comm,
                                     ctx_.comm()));
      else
        DDP_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, op == ReduceOp::Avg ? ncclAvg : ncclSum,
                                     state_->comm, ctx_.comm()));
    });
    if (half) {
      from_16_kernel<<<cast_grid(count), kCastThreads, 0, ctx_.comm()>>>(buf, data, count, bf16);
      DDP_CUDA_CHECK_LAUNCH(from_16_kernel);
    }
    DDP_CUDA_CHECK(cudaEventRecord(w->done_event(), ctx_.comm()));
    return w;
  }

  void check_errors(const std::string& what) override { state_->check_async(what); }
  // Note [step graphs]: done once `stream` passes this point.
  std::shared_ptr<Work> issued_on(cudaStream_t stream, std::string what, const std::string&) override {
    state_->check_async(what);
    auto w = std::make_shared<NcclWork>(state_, pool_, ctx_.compute(), ctx_.device(), std::move(what));
    DDP_CUDA_CHECK(cudaEventRecord(w->done_event(), stream));
    return w;
  }

  // --deterministic's integer sums: exact whatever order NCCL adds in.
  std::shared_ptr<Work> allreduce_int64_async(int64_t* data, size_t count, std::string what) override {
    return sum_async(data, count, ncclInt64, sizeof(int64_t), "int64", what);
  }
  // SyncBatchNorm's sums: on the comm stream, behind the gradient buckets
  // already issued (one stream a communicator keeps every rank's
  // collectives in one order).
  std::shared_ptr<Work> allreduce_doubles_async(double* data, size_t count, std::string what) override {
    return sum_async(data, count, ncclFloat64, sizeof(double), "double", what);
  }

  void synchronize(cudaStream_t stream, const std::string& what) override {
    state_->check_usable(what);
    const milliseconds limit = timeout();
    // A collective waiting on a dead peer never ends: NCCL's own error
    // state, or our deadline, is what tells us.
    if (!stream_done(stream, Clock::now() + bounded(limit), kPollSleep, [&] { state_->check_async(what); }))
      state_->fail(detail::concat(what, " (nccl) did not complete within ", format_duration(limit),
                                  ": another rank may have failed or be stuck"));
  }

  // The watchdog's thread, as the job ends: ncclCommAbort may be called
  // while another thread uses the communicator (that is what it is for);
  // the handle is left in state_, as the process ends in a moment.
  void abort_now() override {
    if (ncclComm_t c = state_->comm) ncclCommAbort(c);
  }

 private:
  // One rank's sum and mean are its values: with --gpu-kernels proven no
  // collective is issued for them (a 16-bit all-reduce still rounds them).
  bool alone() const { return size_ == 1 && ctx_.next(NextKernel::OneRank); }
  // An in-place ncclSum of count values of `type` (`size` bytes, `name`).
  std::shared_ptr<Work> sum_async(void* data, size_t count, ncclDataType_t type, size_t size, const char* name,
                                  const std::string& what) {
    const std::string desc = detail::concat(what, " (", format_bytes(count * size), " as ", name, ")");
    DDP_CHECK(data != nullptr || count == 0, desc, ": null buffer");
    state_->check_usable(desc);
    if (count == 0 || alone()) return std::make_shared<DoneWork>();
    auto w = ordered_work(desc);
    issue(desc, [&] { DDP_NCCL_CHECK(ncclAllReduce(data, data, count, type, ncclSum, state_->comm, ctx_.comm())); });
    DDP_CUDA_CHECK(cudaEventRecord(w->done_event(), ctx_.comm()));
    return w;
  }
  // The 16-bit copy a compressed all-reduce sends, `count` values: one
  // buffer kept for every bucket (they run in turn on the comm stream), so
  // that a captured step allocates nothing (Note [step graphs]); grown,
  // stream-ordered on the comm stream, where a bucket is larger than any
  // before, which makes captured steps stale.
  uint16_t* wire_buffer(size_t count, const std::string& desc) {
    if (count <= wire_count_) return wire_;
    DDP_CHECK(!ctx_.capturing(), desc, ": its 16-bit buffer grown while the step is captured as a CUDA graph");
    if (wire_) {
      ctx_.moved();
      DDP_CUDA_CHECK(cudaFreeAsync(wire_, ctx_.comm()));
      wire_ = nullptr;
      wire_count_ = 0;
    }
    DDP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&wire_), count * sizeof(uint16_t), ctx_.comm()));
    wire_count_ = count;
    return wire_;
  }
  // A collective's Work, the comm stream ordered after what compute has been
  // given so far (Note [device all-reduce order]).
  std::shared_ptr<NcclWork> ordered_work(const std::string& desc) {
    auto w = std::make_shared<NcclWork>(state_, pool_, ctx_.compute(), ctx_.device(), desc);
    DDP_CUDA_CHECK(cudaEventRecord(w->ready(), ctx_.compute()));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(ctx_.comm(), w->ready(), 0));
    return w;
  }

  // Runs the NCCL call(s) of `nccl` (a failure breaks the communicator), then
  // waits until NCCL has put them on the comm stream: a done event recorded
  // after must follow the collective (Note [non-blocking nccl]).
  template <typename F>
  void issue(const std::string& desc, F&& nccl) {
    try {
      nccl();
    } catch (const std::exception& e) {
      state_->fail(detail::concat(desc, " failed (nccl): ", e.what()));
    }
    state_->wait_in_progress(desc, timeout());
  }

  cuda::Context& ctx_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<NcclState> state_;
  std::shared_ptr<EventPool> pool_;
  uint16_t* wire_ = nullptr;  // wire_buffer's, on the comm stream
  size_t wire_count_ = 0;
};

}  // namespace

std::unique_ptr<DeviceCommunicator> make_nccl_communicator(const World& world, cuda::Context& ctx,
                                                           std::chrono::milliseconds init_timeout,
                                                           std::unique_ptr<Communicator> host) {
  return std::make_unique<NcclCommunicator>(world, ctx, init_timeout, std::move(host));
}

}  // namespace ddp::comm
