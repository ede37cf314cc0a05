// The watchdog's bookkeeping (comm/watchdog.hpp): Tracker, what this rank has
// entered and still waits for, and Watched<Base>, the communicator that
// fills it. Private to src/comm (watchdog.cpp, and watched_device.cu for the
// GPU communicators).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/watchdog.hpp"

namespace ddp::comm {

// What this rank last entered, and what it still waits for, as of now.
struct TrackerSnapshot {
  uint64_t entered_seq = 0;
  std::string entered;
  uint64_t pending_seq = 0;
  std::string pending;
  double pending_s = 0, pending_limit_s = 0;
  double idle_s = 0;
};

class Tracker {
 public:
  using Clock = std::chrono::steady_clock;

  Tracker() : owner_(std::this_thread::get_id()), last_event_(Clock::now()) {}

  // While one is alive on a thread, the collectives that thread issues are
  // not numbered (Note [what is watched]: the inner communicator's calls).
  class Nested {
   public:
    Nested() { ++depth(); }
    ~Nested() { --depth(); }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;
  };

  // A collective entered: its sequence number, or 0 where it is not watched.
  uint64_t enter(std::string what, double limit_s) {
    if (std::this_thread::get_id() != owner_ || depth() > 0) return 0;
    std::lock_guard<std::mutex> lk(mu_);
    const auto now = Clock::now();
    ++seq_;
    entered_ = what;
    pending_.push_back({seq_, std::move(what), now, limit_s, nullptr});
    last_event_ = now;
    return seq_;
  }
  // The operation that completes seq: complete once its done() is true.
  void attach(uint64_t seq, std::shared_ptr<Work> work) {
    if (seq == 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    for (Pending& p : pending_)
      if (p.seq == seq) p.work = std::move(work);
  }
  void complete(uint64_t seq) {
    if (seq == 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->seq != seq) continue;
      pending_.erase(it);
      last_event_ = Clock::now();
      return;
    }
  }

  // Polls the pending operations that can say they are done (on the
  // watchdog's thread: never throws; an operation whose done() throws, its
  // communicator failed, stays pending while the caller's thread reports it).
  TrackerSnapshot snapshot() noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    const auto now = Clock::now();
    while (!pending_.empty() && pending_.front().work && done_nothrow(*pending_.front().work)) {
      pending_.pop_front();
      last_event_ = now;
    }
    TrackerSnapshot s;
    s.entered_seq = seq_;
    s.entered = entered_;
    s.idle_s = seconds(now - last_event_);
    if (!pending_.empty()) {
      const Pending& p = pending_.front();
      s.pending_seq = p.seq;
      s.pending = p.what;
      s.pending_s = seconds(now - p.since);
      s.pending_limit_s = p.limit_s;
    }
    return s;
  }

 private:
  struct Pending {
    uint64_t seq;
    std::string what;
    Clock::time_point since;
    double limit_s;
    std::shared_ptr<Work> work;  // null: a blocking call, complete() ends it
  };
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

  const std::thread::id owner_;
  std::mutex mu_;
  uint64_t seq_ = 0;
  std::string entered_;
  std::deque<Pending> pending_;
  Clock::time_point last_event_;
};

// An all-reduce in flight, completing its sequence number when waited for
// if it is then done. A device all-reduce's wait only orders the compute
// stream after it (Note [device all-reduce order]): it stays pending until
// the tracker sees it done, so that a rank whose GPU waits on a stopped
// peer reports the collective it waits for.
class WatchedWork final : public Work {
 public:
  WatchedWork(std::shared_ptr<Work> inner, std::shared_ptr<Tracker> tracker, uint64_t seq)
      : inner_(std::move(inner)), tracker_(std::move(tracker)), seq_(seq) {}
  void wait() override {
    inner_->wait();
    if (inner_->done()) tracker_->complete(seq_);
  }
  bool done() override { return inner_->done(); }
  std::chrono::steady_clock::time_point finished_at() const override { return inner_->finished_at(); }

 private:
  std::shared_ptr<Work> inner_;
  std::shared_ptr<Tracker> tracker_;
  uint64_t seq_;
};

// Base is Communicator or DeviceCommunicator: every collective is entered in
// the tracker, then handed to inner under the timeout plus grace.
template <class Base>
class Watched : public Base {
 public:
  Watched(std::unique_ptr<Base> inner, std::shared_ptr<Tracker> tracker, std::chrono::milliseconds grace)
      : inner_(std::move(inner)), tracker_(std::move(tracker)), grace_(grace) {
    this->set_timeout(inner_->timeout());
  }

  const char* backend() const override { return inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op, std::string what) override {
    return watched_async(what, format_bytes(count * sizeof(float)),
                         [&] { return inner_->allreduce_async(data, count, op, std::move(what)); });
  }
  std::shared_ptr<Work> allreduce_compressed_async(float* data, size_t count, ReduceOp op, Wire wire,
                                                   std::string what) override {
    return watched_async(what,
                         wire == Wire::F32 ? format_bytes(count * sizeof(float))
                                           : format_bytes(count * wire_bytes(wire)) + " as " + wire_name(wire),
                         [&] { return inner_->allreduce_compressed_async(data, count, op, wire, std::move(what)); });
  }
  void broadcast(void* data, size_t bytes, int root, const std::string& what) override {
    Blocking b(*this, "broadcast", what + ", from rank " + std::to_string(root), format_bytes(bytes));
    inner_->broadcast(data, bytes, root, what);
  }
  void barrier(const std::string& what) override {
    Blocking b(*this, "barrier", what, "0 B");
    inner_->barrier(what);
  }
  std::vector<char> allgather(const void* mine, size_t bytes, const std::string& what) override {
    Blocking b(*this, "allgather", what, format_bytes(bytes) + " per rank");
    return inner_->allgather(mine, bytes, what);
  }
  void allreduce_doubles(double* data, size_t count, bool max, const std::string& what) override {
    Blocking b(*this, max ? "max-all-reduce" : "all-reduce", what, format_bytes(count * sizeof(double)));
    inner_->allreduce_doubles(data, count, max, what);
  }
  void allreduce_int64(int64_t* data, size_t count, const std::string& what) override {
    Blocking b(*this, "all-reduce", what, format_bytes(count * sizeof(int64_t)));
    inner_->allreduce_int64(data, count, what);
  }
  std::shared_ptr<Work> allreduce_int64_async(int64_t* data, size_t count, std::string what) override {
    return watched_async(what, format_bytes(count * sizeof(int64_t)),
                         [&] { return inner_->allreduce_int64_async(data, count, std::move(what)); });
  }
  std::shared_ptr<Work> allreduce_doubles_async(double* data, size_t count, std::string what) override {
    return watched_async(what, format_bytes(count * sizeof(double)),
                         [&] { return inner_->allreduce_doubles_async(data, count, std::move(what)); });
  }

 protected:
  // A blocking collective, entered for the scope's life.
  class Blocking {
   public:
    Blocking(Watched& w, const char* kind, const std::string& what, const std::string& bytes)
        : tracker_(*w.tracker_), seq_(w.enter(kind, what, bytes)) {}
    ~Blocking() { tracker_.complete(seq_); }
    Blocking(const Blocking&) = delete;
    Blocking& operator=(const Blocking&) = delete;

   private:
    Tracker& tracker_;
    const uint64_t seq_;
    Tracker::Nested inside_;
  };

  uint64_t enter(const char* kind, const std::string& what, const std::string& bytes) {
    inner_->set_timeout(this->timeout() + grace_);
    return tracker_->enter(collective_label(kind, what, bytes),
                           std::chrono::duration<double>(this->timeout()).count());
  }
  // An all-reduce in flight: entered, issued by `issue` (the inner
  // communicator's call, not numbered again), its Work watched.
  template <class Issue>
  std::shared_ptr<Work> watched_async(const std::string& what, const std::string& bytes, const Issue& issue) {
    if (unwatched_) return issue();
    const uint64_t seq = enter("all-reduce", what, bytes);
    std::shared_ptr<Work> w;
    {
      Tracker::Nested inside;
      w = issue();
    }
    return watched(seq, std::move(w));
  }
  // A null Work: nothing in flight, complete at once.
  std::shared_ptr<Work> watched(uint64_t seq, std::shared_ptr<Work> w) {
    if (seq == 0) return w;
    if (!w) {
      tracker_->complete(seq);
      return w;
    }
    tracker_->attach(seq, w);
    return std::make_shared<WatchedWork>(std::move(w), tracker_, seq);
  }

  std::unique_ptr<Base> inner_;
  std::shared_ptr<Tracker> tracker_;
  const std::chrono::milliseconds grace_;
  // Note [step graphs]: a capture under way, whose collectives are not run.
  bool unwatched_ = false;
};

}  // namespace ddp::comm
