// The MPI backend of Communicator: host memory, Open MPI collectives.
//
// Note [mpi progress]: Open MPI 4.1 has no asynchronous progress (measured
// with bench/bench_overlap.cpp, bench/RESULTS.md): a non-blocking collective
// moves only while some thread of this process is inside an MPI call. So
// every request we start is driven by a loop of
// MPI_Test on the thread that waits for it: the communication thread for
// all-reduces, so that they move while the caller computes; the caller itself
// for the blocking collectives. We never block inside MPI: a loop can give up
// at a deadline or at shutdown, a blocking call cannot, and a dead peer must
// not hang the job. The loop sleeps between tests (MpiOptions) instead of
// spinning: on a box with fewer cores than busy threads, a spinning thread
// takes a core from the GEMMs it is meant to hide behind, and from the peer
// rank whose progress it is waiting for. Measured with bench_overlap --poll
// at np 2 on 2 cores: spinning (our loop flat out, or a thread inside
// blocking MPI_Allreduce) made the step slower than sleeping, and so did
// spinning only while the caller sits in wait().
//
// Note [two communicators]: MPI forbids collectives on one communicator from
// two threads at once (their matching order across ranks would be undefined).
// The communication thread owns async_comm_, the caller's thread sync_comm_,
// both duplicates of world.comm; each sees its own operations in issue order.
//
// Note [abandoned requests]: MPI cannot cancel a collective. When we stop
// waiting for one (timeout, shutdown) it stays posted, and any later MPI call
// in this process may progress it and write into its buffer. So the blocking
// collectives work on staging buffers we own, and one that timed out keeps its
// buffer (orphans_) until it completes, which it does if the late peers still
// arrive. If it never completes, buffer and communicator are leaked on
// purpose: the job is ending anyway (docs/errors.md: any error ends the job).
// All-reduces work in place on the caller's buffer (Note [flat layout] in nn/graph.hpp: a bucket is all-reduced in place), so
// after a timed-out all-reduce that buffer must outlive the process's MPI use.
#include <mpi.h>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/abandon.hpp"  // abandon: buffers an in-flight collective may write
#include "ddp/core/error.hpp"
#include "ddp/core/half.hpp"      // float_to_fp16, float_to_bf16 and back: 16-bit all-reduces
#include "ddp/runtime/mpi_check.hpp"

namespace ddp::comm {
namespace {

using Clock = std::chrono::steady_clock;

// MPI counts are int; larger buffers go in pieces.
constexpr size_t kMaxElementsPerCall = size_t(1) << 30;
// Broadcasts are staged (Note [abandoned requests]) in pieces of this size, so
// the staging copy stays small next to the parameters it moves.
constexpr size_t kBroadcastChunkBytes = size_t(64) << 20;

std::string timeout_message(const std::string& what, std::chrono::milliseconds timeout) {
  return detail::concat(what, " did not complete within ", format_duration(timeout),
                        ": another rank may have failed or be stuck");
}

// A timeout beyond this is "never"; it keeps now() + timeout from overflowing.
std::chrono::milliseconds bounded(std::chrono::milliseconds t) {
  return std::clamp(t, std::chrono::milliseconds(0),
                    std::chrono::milliseconds(std::chrono::hours(24 * 365 * 10)));
}

enum class Polled { Done, Deadline, Stopped };

// Drives one request to completion (Note [mpi progress]). *rc is MPI_Test's
// return code when Done.
Polled poll(MPI_Request* req, const MpiOptions& opt, Clock::time_point deadline,
            const std::atomic<bool>* stop, int* rc) {
  const auto start = Clock::now();
  const auto spin = std::chrono::microseconds(std::max(0, opt.spin_us));
  const int max_sleep = std::max(0, opt.max_sleep_us);
  int sleep_us = 1;
  for (;;) {
    int flag = 0;
    *rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (*rc != MPI_SUCCESS || flag) return Polled::Done;
    const auto now = Clock::now();
    if (now >= deadline) return Polled::Deadline;
    if (stop && stop->load(std::memory_order_relaxed)) return Polled::Stopped;
    if (now - start < spin || max_sleep == 0) continue;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(2 * sleep_us, max_sleep);
  }
}

class MpiWork final : public Work {
 public:
  MpiWork(std::string what, float* data, size_t count, ReduceOp op, Wire wire,
          std::chrono::milliseconds timeout)
      : what_(std::move(what)), data_(data), count_(count), op_(op), wire_(wire), timeout_(bounded(timeout)) {}
  // A sum of int64 values (--deterministic's fixed-point sums).
  MpiWork(std::string what, int64_t* ints, size_t count, std::chrono::milliseconds timeout)
      : what_(std::move(what)), data_(nullptr), ints_(ints), count_(count), op_(ReduceOp::Sum), wire_(Wire::F32),
        timeout_(bounded(timeout)) {}

  void wait() override {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, timeout_, [&] { return finished_; }))
      throw Error(timeout_message(describe(), timeout_));
    if (!error_.empty()) throw Error(error_);
  }

  bool done() override {
    std::lock_guard<std::mutex> lk(mu_);
    return finished_;
  }

  void finish(std::string error) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      finished_ = true;
      finished_at_ = std::chrono::steady_clock::now();
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

  std::chrono::steady_clock::time_point finished_at() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return finished_at_;
  }

  std::string describe() const {
    if (ints_) return detail::concat(what_, " (", format_bytes(count_ * sizeof(int64_t)), " as int64)");
    return allreduce_label(what_, count_, wire_);
  }

  float* data() const { return data_; }
  int64_t* ints() const { return ints_; }
  size_t count() const { return count_; }
  ReduceOp op() const { return op_; }
  Wire wire() const { return wire_; }

 private:
  const std::string what_;
  float* const data_;
  int64_t* const ints_ = nullptr;
  const size_t count_;
  const ReduceOp op_;
  const Wire wire_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point finished_at_;
  std::string error_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const World& world, const MpiOptions& opt) : opt_(opt) {
    DDP_MPI_CHECK(MPI_Comm_rank(world.comm, &rank_));
    DDP_MPI_CHECK(MPI_Comm_size(world.comm, &size_));
    // Note [two communicators].
    DDP_MPI_CHECK(MPI_Comm_dup(world.comm, &async_comm_));
    DDP_MPI_CHECK(MPI_Comm_dup(world.comm, &sync_comm_));
    // Failures come back as codes, to be reported by wait() with context,
    // instead of MPI ending the job with its own message.
    DDP_MPI_CHECK(MPI_Comm_set_errhandler(async_comm_, MPI_ERRORS_RETURN));
    DDP_MPI_CHECK(MPI_Comm_set_errhandler(sync_comm_, MPI_ERRORS_RETURN));
    MPI_Comm_set_name(async_comm_, "ddp all-reduce");
    MPI_Comm_set_name(sync_comm_, "ddp blocking");
    DDP_MPI_CHECK(MPI_Op_create(&add_fp16, /*commute=*/1, &sum_fp16_));
    DDP_MPI_CHECK(MPI_Op_create(&add_bf16, /*commute=*/1, &sum_bf16_));
    if (size_ > 1) thread_ = std::thread([this] { run(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true);
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (auto& w : queue_)
      w->finish(detail::concat(w->describe(), " was not started: the communicator was destroyed"));
    queue_.clear();
    reap_orphans();
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Note [abandoned requests]: a communicator with a request still posted is
    // leaked, and so is that request's staging buffer.
    if (!abandoned_async_) {
      MPI_Comm_free(&async_comm_);
      MPI_Op_free(&sum_fp16_);
      MPI_Op_free(&sum_bf16_);
    } else {
      abandon(std::move(stage16_));  // the same heap buffer, never freed
    }
    if (orphans_.empty())
      MPI_Comm_free(&sync_comm_);
    else
      abandon(std::move(orphans_));
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
    auto w = std::make_shared<MpiWork>(std::move(what), data, count, op, wire, timeout_);
    DDP_CHECK(data != nullptr || count == 0, w->describe(), ": null buffer");
    // With one rank the sum and the mean are the buffer itself; in 16 bits
    // rounded, as at any world size (and as NCCL's, and PyTorch's
    // fp16_compress_hook, round one rank's).
    if (size_ == 1 || count == 0) {
      if (wire != Wire::F32) round_to_wire(data, count, wire == Wire::BF16);
      w->finish("");
      return w;
    }
    enqueue(w);
    return w;
  }

  // On the communication thread as the float all-reduces, in issue order
  // with them: --deterministic's sums travel while backward computes.
  std::shared_ptr<Work> allreduce_int64_async(int64_t* data, size_t count, std::string what) override {
    auto w = std::make_shared<MpiWork>(std::move(what), data, count, timeout_);
    DDP_CHECK(data != nullptr || count == 0, w->describe(), ": null buffer");
    if (size_ == 1 || count == 0) {
      w->finish("");
      return w;
    }
    enqueue(w);
    return w;
  }

  void broadcast(void* data, size_t bytes, int root, const std::string& what) override {
    DDP_CHECK(root >= 0 && root < size_, what, ": broadcast root ", root,
              " is not a rank of this world of ", size_);
    DDP_CHECK(data != nullptr || bytes == 0, what, ": broadcast of a null buffer");
    if (size_ == 1 || bytes == 0) return;
    const std::string desc =
        detail::concat(what, " (broadcast of ", format_bytes(bytes), " from rank ", root, ")");
    char* p = static_cast<char*>(data);
    std::vector<char> stage(std::min(bytes, kBroadcastChunkBytes));
    for (size_t off = 0; off < bytes; off += stage.size()) {
      const size_t n = std::min(stage.size(), bytes - off);
      if (rank_ == root) std::memcpy(stage.data(), p + off, n);
      MPI_Request req;
      check(MPI_Ibcast(stage.data(), int(n), MPI_BYTE, root, sync_comm_, &req), desc);
      complete(&req, stage, desc);
      if (rank_ != root) std::memcpy(p + off, stage.data(), n);
    }
  }

  void barrier(const std::string& what) override {
    if (size_ == 1) return;
    const std::string desc = detail::concat(what, " (barrier)");
    std::vector<char> none;
    MPI_Request req;
    check(MPI_Ibarrier(sync_comm_, &req), desc);
    complete(&req, none, desc);
  }

  std::vector<char> allgather(const void* mine, size_t bytes, const std::string& what) override {
    DDP_CHECK(mine != nullptr || bytes == 0, what, ": allgather of a null buffer");
    DDP_CHECK(bytes <= size_t(INT_MAX), what, ": allgather of ", format_bytes(bytes),
              " per rank is too large (it is meant for metadata)");
    if (size_ == 1 || bytes == 0) {
      const char* p = static_cast<const char*>(mine);
      return std::vector<char>(p, p + bytes);
    }
    const std::string desc =
        detail::concat(what, " (allgather of ", format_bytes(bytes), " per rank)");
    // One allocation holds our contribution and the result, so that an
    // abandoned request keeps both alive (Note [abandoned requests]).
    std::vector<char> stage(bytes * (size_ + 1));
    std::memcpy(stage.data() + bytes * size_, mine, bytes);
    MPI_Request req;
    check(MPI_Iallgather(stage.data() + bytes * size_, int(bytes), MPI_BYTE, stage.data(),
                         int(bytes), MPI_BYTE, sync_comm_, &req),
          desc);
    complete(&req, stage, desc);
    stage.resize(bytes * size_);
    return stage;
  }

  void allreduce_doubles(double* data, size_t count, bool max, const std::string& what) override {
    DDP_CHECK(data != nullptr || count == 0, what, ": all-reduce of a null buffer");
    DDP_CHECK(count <= size_t(INT_MAX) / sizeof(double), what, ": all-reduce of ", count,
              " doubles is too large (it is meant for metrics)");
    if (size_ == 1 || count == 0) return;
    const std::string desc =
        detail::concat(what, " (all-reduce ", max ? "max" : "sum", " of ", count, " doubles)");
    std::vector<char> stage(count * sizeof(double));
    std::memcpy(stage.data(), data, stage.size());
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, stage.data(), int(count), MPI_DOUBLE,
                         max ? MPI_MAX : MPI_SUM, sync_comm_, &req),
          desc);
    complete(&req, stage, desc);
    std::memcpy(data, stage.data(), stage.size());
  }

  void allreduce_int64(int64_t* data, size_t count, const std::string& what) override {
    DDP_CHECK(data != nullptr || count == 0, what, ": all-reduce of a null buffer");
    if (size_ == 1 || count == 0) return;
    // In pieces an int count can hold, each staged (Note [abandoned requests]).
    constexpr size_t kPiece = size_t(1) << 24;
    std::vector<char> stage(std::min(count, kPiece) * sizeof(int64_t));
    for (size_t off = 0; off < count; off += kPiece) {
      const size_t n = std::min(kPiece, count - off);
      const std::string desc = detail::concat(what, " (all-reduce sum of ", n, " int64",
                                              count > kPiece ? detail::concat(", from element ", off) : "", ")");
      std::memcpy(stage.data(), data + off, n * sizeof(int64_t));
      MPI_Request req;
      check(MPI_Iallreduce(MPI_IN_PLACE, stage.data(), int(n), MPI_INT64_T, MPI_SUM, sync_comm_, &req), desc);
      complete(&req, stage, desc);
      std::memcpy(data + off, stage.data(), n * sizeof(int64_t));
    }
  }

 private:
  struct Orphan {
    MPI_Request req;
    std::vector<char> buffer;
  };

  // Hands w to the communication thread.
  void enqueue(const std::shared_ptr<MpiWork>& w) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      DDP_CHECK(!stop_.load(), w->describe(), ": the communicator is shutting down");
      queue_.push_back(w);
    }
    cv_.notify_one();
  }

  static void check(int rc, const std::string& desc) {
    if (rc != MPI_SUCCESS) DDP_FAIL(desc, " failed: ", mpi_error_string(rc));
  }

  // Waits for a blocking collective on the caller's thread, bounded by the
  // timeout. On timeout the request and its buffer become an orphan.
  void complete(MPI_Request* req, std::vector<char>& buffer, const std::string& desc) {
    const auto timeout = bounded(timeout_);
    int rc = MPI_SUCCESS;
    if (poll(req, opt_, Clock::now() + timeout, nullptr, &rc) == Polled::Deadline) {
      orphans_.push_back({*req, std::move(buffer)});
      throw Error(timeout_message(desc, timeout));
    }
    check(rc, desc);
    reap_orphans();
  }

  void reap_orphans() {
    for (auto it = orphans_.begin(); it != orphans_.end();) {
      int flag = 0;
      if (MPI_Test(&it->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag)
        it = orphans_.erase(it);
      else
        ++it;
    }
  }

  // The communication thread: all-reduces one at a time, in issue order, so
  // every rank matches them the same way (Note [two communicators]).
  void run() {
#ifdef __linux__
    // Without this, a sleep of a few microseconds lasts the default timer
    // slack of 50 us, which is latency added to every poll.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
    std::string broken;  // once a collective failed, this communicator is unusable
    for (;;) {
      std::shared_ptr<MpiWork> w;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_.load() || !queue_.empty(); });
        if (stop_.load()) return;
        w = queue_.front();
        queue_.pop_front();
      }
      std::string error;
      if (!broken.empty()) {
        error = detail::concat(w->describe(), " was not started: an earlier operation failed: ",
                               broken);
      } else {
        try {
          error = execute(*w);
        } catch (const std::exception& e) {
          error = detail::concat(w->describe(), " failed: ", e.what());
        }
        if (!error.empty()) broken = error;
      }
      w->finish(std::move(error));
      if (stop_.load()) return;
    }
  }

  std::string execute(const MpiWork& w) {
    if (w.ints()) return sum_in_place(w, w.ints(), sizeof(int64_t), MPI_INT64_T, MPI_SUM);
    if (w.wire() != Wire::F32) return execute_16(w);
    float* const data = w.data();
    if (std::string error = sum_in_place(w, data, sizeof(float), MPI_FLOAT, MPI_SUM); !error.empty()) return error;
    // Avg is a sum scaled here, off the caller's thread, while it computes.
    if (w.op() == ReduceOp::Avg) {
      const float scale = 1.0f / float(size_);
      for (size_t i = 0; i < w.count(); ++i) data[i] *= scale;
    }
    return "";
  }

  // MPI_Iallreduce of w.count() elements of `type` at buf, in place, in
  // pieces any MPI count holds, each polled to completion; "" or the error.
  std::string sum_in_place(const MpiWork& w, void* buf, size_t elem_bytes, MPI_Datatype type, MPI_Op op) {
    char* const bytes = static_cast<char*>(buf);
    for (size_t off = 0; off < w.count(); off += kMaxElementsPerCall) {
      const int n = int(std::min(kMaxElementsPerCall, w.count() - off));
      MPI_Request req;
      int rc = MPI_Iallreduce(MPI_IN_PLACE, bytes + off * elem_bytes, n, type, op, async_comm_, &req);
      if (rc != MPI_SUCCESS)
        return detail::concat(w.describe(), " failed: MPI_Iallreduce: ", mpi_error_string(rc));
      if (poll(&req, opt_, Clock::time_point::max(), &stop_, &rc) == Polled::Stopped) {
        abandoned_async_ = true;  // Note [abandoned requests]
        return detail::concat(w.describe(), " did not complete: the communicator was destroyed");
      }
      if (rc != MPI_SUCCESS)
        return detail::concat(w.describe(), " failed: MPI_Test: ", mpi_error_string(rc));
    }
    return "";
  }

  // Note [16-bit all-reduce]: the floats rounded to 16 bits (divided by the
  // world size first for Avg), summed by a user-defined MPI operation that
  // adds two values in float and rounds the sum back (what a 16-bit add
  // does), then widened into the caller's buffer. All of it on this thread,
  // off the caller's. The sum's rounding order is Open MPI's, the same on
  // every rank.
  std::string execute_16(const MpiWork& w) {
    const bool bf16 = w.wire() == Wire::BF16;
    const float pre = w.op() == ReduceOp::Avg ? 1.0f / float(size_) : 1.0f;
    float* const data = w.data();
    stage16_.resize(w.count());
    for (size_t i = 0; i < w.count(); ++i) stage16_[i] = to_wire(data[i] * pre, bf16);
    const std::string error = sum_in_place(w, stage16_.data(), sizeof(uint16_t), MPI_UINT16_T,
                                           bf16 ? sum_bf16_ : sum_fp16_);
    if (!error.empty()) return error;
    for (size_t i = 0; i < w.count(); ++i) data[i] = from_wire(stage16_[i], bf16);
    return "";
  }

  // A value in the wire's 16-bit format, and back.
  static uint16_t to_wire(float v, bool bf16) { return bf16 ? float_to_bf16(v) : float_to_fp16(v); }
  static float from_wire(uint16_t h, bool bf16) { return bf16 ? bf16_to_float(h) : fp16_to_float(h); }
  // One rank's 16-bit all-reduce: each value rounded to the wire's format.
  static void round_to_wire(float* data, size_t count, bool bf16) {
    for (size_t i = 0; i < count; ++i) data[i] = from_wire(to_wire(data[i], bf16), bf16);
  }

  static void add_fp16(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const uint16_t*>(in);
    auto* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = float_to_fp16(fp16_to_float(a[i]) + fp16_to_float(b[i]));
  }
  static void add_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const uint16_t*>(in);
    auto* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
  }

  const MpiOptions opt_;
  int rank_ = 0, size_ = 1;
  MPI_Op sum_fp16_ = MPI_OP_NULL, sum_bf16_ = MPI_OP_NULL;
  std::vector<uint16_t> stage16_;  // the communication thread's
  MPI_Comm async_comm_ = MPI_COMM_NULL, sync_comm_ = MPI_COMM_NULL;

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<MpiWork>> queue_;
  std::atomic<bool> stop_{false};
  bool abandoned_async_ = false;  // written by the thread, read after join

  std::vector<Orphan> orphans_;  // caller's thread only
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const World& world, const MpiOptions& options) {
  return std::make_unique<MpiCommunicator>(world, options);
}

std::unique_ptr<Communicator> make_mpi_communicator(const World& world) {
  return make_mpi_communicator(world, MpiOptions{});
}

}  // namespace ddp::comm
