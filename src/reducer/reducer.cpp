// Bucketed gradient averaging (docs/ARCHITECTURE.md, ddp/). The invariants this file relies
// on are Note [bucket order] (reducer.hpp) and Note [flat layout] (nn/graph.hpp).
#include "ddp/reducer/reducer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ddp/core/error.hpp"

namespace ddp {

namespace {

// The first bucket is small so that the first all-reduce starts after the
// last layer's backward instead of after a quarter of the model.
constexpr size_t kFirstBucketCapBytes = size_t(1) << 20;

// Broadcast in pieces, so that each piece's timeout is meaningful and the
// communicator's staging copy stays small.
constexpr size_t kBroadcastChunkFloats = size_t(16) << 20;

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

uint64_t fnv1a(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

std::vector<Bucket> plan_buckets(const std::vector<size_t>& param_numels, size_t cap_bytes,
                                 size_t first_cap_bytes) {
  std::vector<Bucket> buckets;
  size_t offset = 0, bytes = 0;  // bytes: of the open bucket, buckets.back()
  for (size_t p = 0; p < param_numels.size(); ++p) {
    const size_t b = param_numels[p] * sizeof(float);
    const size_t cap = buckets.size() == 1 ? first_cap_bytes : cap_bytes;
    // A parameter is never split (Note [bucket order]); one larger than the
    // cap closes the open bucket and gets one of its own.
    if (buckets.empty() || (bytes > 0 && bytes + b > cap)) {
      Bucket k;
      k.begin = k.end = offset;
      k.first_param = k.last_param = p;
      buckets.push_back(k);
      bytes = 0;
    }
    offset += param_numels[p];
    bytes += b;
    buckets.back().end = offset;
    buckets.back().last_param = p + 1;
  }
  return buckets;
}

Reducer::Reducer(comm::Communicator& comm, float* grads, const std::vector<size_t>& param_numels,
                 double bucket_cap_mb, bool overlap, comm::Wire wire)
    : comm_(comm), grads_(grads), overlap_(overlap), wire_(wire) {
  DDP_CHECK(std::isfinite(bucket_cap_mb) && bucket_cap_mb > 0,
            "reducer: bucket cap must be a positive number of MiB, got ", bucket_cap_mb);
  const size_t cap = size_t(std::max(1.0, bucket_cap_mb * 1024 * 1024));
  buckets_ = plan_buckets(param_numels, cap, std::min(kFirstBucketCapBytes, cap));
  const size_t total = buckets_.empty() ? 0 : buckets_.back().end;
  DDP_CHECK(grads_ != nullptr || total == 0, "reducer: null gradient buffer for ", total,
            " elements");
  work_.resize(buckets_.size());
  launched_at_.resize(buckets_.size());
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const Bucket& b = buckets_[k];
    names_.push_back(detail::concat("all-reduce of bucket ", k, " of ", buckets_.size(), " (parameters ",
                                    b.first_param, "..", b.last_param == 0 ? 0 : b.last_param - 1, ")"));
  }

  // Note [bucket order]: every rank must issue the same all-reduces, so a
  // model or cap that differs between ranks is an error now rather than a
  // hang or silent garbage at the first step.
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t n : param_numels) h = fnv1a(h, n);
  for (const Bucket& b : buckets_) h = fnv1a(fnv1a(h, b.begin), b.end);
  const uint64_t mine[3] = {uint64_t(param_numels.size()), uint64_t(total), h};
  const std::vector<char> all =
      comm_.allgather(mine, sizeof mine, "reducer: checking the bucket plan agrees across ranks");
  for (int r = 0; r < comm_.size(); ++r) {
    uint64_t theirs[3];
    std::memcpy(theirs, all.data() + r * sizeof mine, sizeof mine);
    DDP_CHECK(std::equal(theirs, theirs + 3, mine), "reducer: rank ", r, " has ", theirs[0],
              " parameters (", theirs[1], " elements) and rank ", comm_.rank(), " has ", mine[0],
              " (", mine[1], " elements)",
              theirs[0] == mine[0] && theirs[1] == mine[1]
                  ? ", with different shapes or bucket caps"
                  : "",
              ": every rank must build the same model with the same --bucket-cap-mb");
  }
}

void Reducer::begin_backward() {
  // A step that started communicating must be finished on every rank before
  // the next one starts, or the ranks' sequences of collectives diverge.
  DDP_CHECK(next_ == 0, "reducer: begin_backward() while buckets 0..", next_ - 1,
            " of the previous step are in flight; call finish() after every backward that "
            "communicates");
  launched_early_ = 0;
}

void Reducer::grads_ready(size_t n) {
  if (!sync_ || !overlap_) return;
  const size_t total = buckets_.empty() ? 0 : buckets_.back().end;
  DDP_CHECK(n <= total, "reducer: grads_ready(", n, ") beyond the ", total,
            " elements of the gradient buffer");
  // Note [bucket order]: strictly in index order, and only whole buckets.
  while (next_ < buckets_.size() && buckets_[next_].end <= n) {
    launch(next_++);
    ++launched_early_;
  }
}

ReducerStats Reducer::finish() {
  ReducerStats stats;
  // no_sync skips communication, unless this step already started it (sync
  // was turned off mid-backward): then it is completed like any other, so the
  // ranks' sequences of collectives stay identical.
  if (!sync_ && next_ == 0) {
    launched_early_ = 0;
    return stats;
  }
  stats.buckets_launched_early = launched_early_;
  const auto called = std::chrono::steady_clock::now();
  while (next_ < buckets_.size()) launch(next_++);
  const auto t0 = std::chrono::steady_clock::now();
  // Whatever happens, the next step starts from a clean slate.
  struct Reset {
    Reducer& r;
    ~Reset() {
      std::fill(r.work_.begin(), r.work_.end(), nullptr);
      r.next_ = 0;
      r.launched_early_ = 0;
    }
  } reset{*this};
  std::chrono::steady_clock::time_point covered{};  // the in-flight time counted so far ends here
  for (size_t k = 0; k < work_.size(); ++k) {
    work_[k]->wait();  // the messages name the bucket (launch)
    auto done = work_[k]->finished_at();
    if (done == std::chrono::steady_clock::time_point{}) done = std::chrono::steady_clock::now();
    // Buckets launch in index order, so the union of their in-flight
    // intervals is a sweep in that order.
    const auto begin = std::max(launched_at_[k], covered);
    if (done > begin) {
      stats.comm_sec += seconds(done - begin);
      if (called > begin) stats.hidden_sec += seconds(std::min(done, called) - begin);
      covered = done;
    }
    if (trace_ && trace_->active()) {
      const Bucket& b = buckets_[k];
      trace_->span(Trace::kFirstBucket + int(k), "comm", detail::concat("all-reduce bucket ", k), launched_at_[k],
                   done,
                   {{"step", trace_->step()},
                    {"bucket", int64_t(k)},
                    {"bytes", int64_t((b.end - b.begin) * comm::wire_bytes(wire_))},
                    {"params", int64_t(b.last_param - b.first_param)}});
    }
  }
  stats.wait_sec = seconds(std::chrono::steady_clock::now() - t0);
  return stats;
}

void Reducer::launch(size_t k) {
  const Bucket& b = buckets_[k];
  launched_at_[k] = std::chrono::steady_clock::now();
  ++launches_;
  launched_bytes_ += int64_t((b.end - b.begin) * comm::wire_bytes(wire_));
  work_[k] = comm_.allreduce_compressed_async(grads_ + b.begin, b.end - b.begin, comm::ReduceOp::Avg, wire_,
                                              names_[k]);
}

void Reducer::set_param_names(std::vector<std::string> names) {
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const Bucket& b = buckets_[k];
    if (b.last_param > names.size() || b.last_param == b.first_param) continue;
    names_[k] = detail::concat("all-reduce of bucket ", k, " of ", buckets_.size(), " (parameters ", b.first_param,
                               "..", b.last_param - 1, ": ", names[b.first_param],
                               b.last_param - b.first_param > 1 ? " .. " + names[b.last_param - 1] : "", ")");
  }
}

void broadcast_from_rank0(comm::Communicator& comm, float* data, size_t count, const std::string& what) {
  if (comm.size() == 1) return;
  for (size_t off = 0; off < count; off += kBroadcastChunkFloats) {
    const size_t n = std::min(kBroadcastChunkFloats, count - off);
    comm.broadcast(data + off, n * sizeof(float), 0,
                   detail::concat("broadcast of ", what, " [", off, ", ", off + n, ") of ", count, " from rank 0"));
  }
}

}  // namespace ddp
