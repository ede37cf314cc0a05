// ddp::Trace: one rank's timeline for --trace, written as Chrome trace-event
// JSON (Perfetto, chrome://tracing). The rank is the process (pid), a track
// is a thread (tid): the step's own thread, one track per bucket for its
// all-reduce from launch to completion, since the all-reduces of one step
// overlap each other and spans on one track must nest, and on a GPU one
// track per stream for what the device ran (runtime/gpu_trace.hpp).
//
// Recording is cheap but not free, so it happens only while a step of the
// window (--trace-steps) runs, and whatever follows it before the next step
// (evaluation, a checkpoint); everything asks active() first.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  // A span's arguments: integers only (steps, indices, bytes).
  using Args = std::vector<std::pair<const char*, int64_t>>;
  enum Track : int { kStep = 1, kFirstBucket = 100, kFirstGpuStream = 100000 };

  // Steps first..last (global steps, 1-based, inclusive) of the rank's run
  // on host `host`; times are counted from `origin`, which every rank takes
  // at the same moment (after a barrier), so the ranks' files line up.
  Trace(int rank, std::string host, int64_t first, int64_t last, Clock::time_point origin);

  // A training step starts: recording is on while it is in the window.
  void begin_step(int64_t global_step) {
    step_ = global_step;
    active_ = global_step >= first_ && global_step <= last_;
  }
  int64_t step() const { return step_; }  // the step that began last
  bool active() const { return active_; }
  // Whether the window is behind us: the file can be written.
  bool window_passed(int64_t global_step) const { return global_step > last_; }

  // A complete span on a track (nothing when not active).
  void span(int track, const char* category, std::string name, Clock::time_point t0, Clock::time_point t1,
            Args args = {});
  // A span the device ran on its stream `stream` (a kernel, a copy): kept
  // whether or not a step is active, since the device's records arrive
  // after the window; the recorder bounds them to it.
  void device_span(uint32_t stream, const char* category, std::string name, Clock::time_point t0,
                   Clock::time_point t1, Args args = {});
  // The Chrome trace JSON of what was recorded, with the names of the
  // process ("rank R (host)") and of every track used.
  std::string json() const;
  // Writes json() to path (an error names it); once.
  void write(const std::string& path);
  bool written() const { return written_; }
  size_t events() const { return events_.size(); }

 private:
  void record(int track, const char* category, std::string name, Clock::time_point t0, Clock::time_point t1,
              Args args);
  struct Event {
    int track;
    const char* category;
    std::string name;
    int64_t ts_ns, dur_ns;
    Args args;
  };
  int rank_;
  std::string host_;
  int64_t first_, last_, step_ = 0;
  Clock::time_point origin_;
  bool active_ = false, written_ = false;
  std::vector<Event> events_;
};

// The span a scope covers, on `trace` when it is non-null and active.
class TraceScope {
 public:
  TraceScope(Trace* trace, int track, const char* category, std::string name, Trace::Args args = {})
      : trace_(trace && trace->active() ? trace : nullptr) {
    if (!trace_) return;
    track_ = track;
    category_ = category;
    name_ = std::move(name);
    args_ = std::move(args);
    t0_ = Trace::Clock::now();
  }
  ~TraceScope() {
    if (trace_) trace_->span(track_, category_, std::move(name_), t0_, Trace::Clock::now(), std::move(args_));
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace* trace_;
  int track_ = 0;
  const char* category_ = "";
  std::string name_;
  Trace::Args args_;
  Trace::Clock::time_point t0_;
};

// "trace.json" for rank 2 -> "trace.rank2.json"; without an extension the
// rank is appended.
std::string trace_path_for_rank(const std::string& path, int rank);

}  // namespace ddp
