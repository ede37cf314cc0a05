// CheckedCommunicator (comm/checked_communicator.hpp).
#include "ddp/comm/checked_communicator.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"

namespace ddp::comm {

namespace {

// What one rank is about to call; fixed size for the allgather.
struct Call {
  uint64_t seq;
  uint64_t count;   // elements (all-reduces) or bytes (broadcast, allgather)
  int32_t kind;
  int32_t root;     // broadcast; else -1
  char what[112];   // the caller's name for it, cut
};

enum Kind : int32_t { kAllreduce, kAllreduce16, kBroadcast, kBarrier, kAllgather, kAllreduceDoubles, kAllreduceInt64 };

const char* kind_name(int32_t k) {
  switch (k) {
    case kAllreduce: return "all-reduce";
    case kAllreduce16: return "16-bit all-reduce";
    case kBroadcast: return "broadcast";
    case kBarrier: return "barrier";
    case kAllgather: return "allgather";
    case kAllreduceDoubles: return "all-reduce of doubles";
    case kAllreduceInt64: return "all-reduce of int64";
  }
  return "collective";
}

std::string describe(const Call& c) {
  std::string s = detail::concat("call #", c.seq, ": ", kind_name(c.kind), " of ", c.count,
                                 c.kind == kBroadcast || c.kind == kAllgather ? " bytes" : " values");
  if (c.root >= 0) s += detail::concat(" from rank ", c.root);
  return s + " (\"" + std::string(c.what, strnlen(c.what, sizeof c.what)) + "\")";
}

// The callers' names take part: two all-reduces of one size are still
// different calls when one is "bucket 3" and the other something else.
bool same(const Call& a, const Call& b) {
  return a.seq == b.seq && a.count == b.count && a.kind == b.kind && a.root == b.root &&
         std::strncmp(a.what, b.what, sizeof a.what) == 0;
}

class CheckedCommunicator final : public Communicator {
 public:
  explicit CheckedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  const char* backend() const override { return inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op, std::string what) override {
    check(kAllreduce, count, -1, what);
    return inner_->allreduce_async(data, count, op, std::move(what));
  }
  std::shared_ptr<Work> allreduce_compressed_async(float* data, size_t count, ReduceOp op, Wire wire,
                                                   std::string what) override {
    check(wire == Wire::F32 ? kAllreduce : kAllreduce16, count, -1, what);
    return inner_->allreduce_compressed_async(data, count, op, wire, std::move(what));
  }
  void broadcast(void* data, size_t bytes, int root, const std::string& what) override {
    check(kBroadcast, bytes, root, what);
    inner_->broadcast(data, bytes, root, what);
  }
  void barrier(const std::string& what) override {
    check(kBarrier, 0, -1, what);
    inner_->barrier(what);
  }
  std::vector<char> allgather(const void* mine, size_t bytes, const std::string& what) override {
    check(kAllgather, bytes, -1, what);
    return inner_->allgather(mine, bytes, what);
  }
  void allreduce_doubles(double* data, size_t count, bool max, const std::string& what) override {
    check(kAllreduceDoubles, count, -1, what);
    inner_->allreduce_doubles(data, count, max, what);
  }
  void allreduce_int64(int64_t* data, size_t count, const std::string& what) override {
    check(kAllreduceInt64, count, -1, what);
    inner_->allreduce_int64(data, count, what);
  }
  std::shared_ptr<Work> allreduce_int64_async(int64_t* data, size_t count, std::string what) override {
    check(kAllreduceInt64, count, -1, what);
    return inner_->allreduce_int64_async(data, count, std::move(what));
  }
  std::shared_ptr<Work> allreduce_doubles_async(double* data, size_t count, std::string what) override {
    check(kAllreduceDoubles, count, -1, what);
    return inner_->allreduce_doubles_async(data, count, std::move(what));
  }

 private:
  void check(int32_t kind, size_t count, int root, const std::string& what) {
    inner_->set_timeout(timeout());
    Call mine{};
    mine.seq = ++seq_;
    mine.count = count;
    mine.kind = kind;
    mine.root = root;
    std::snprintf(mine.what, sizeof mine.what, "%s", what.c_str());
    if (inner_->size() == 1) return;
    const std::vector<char> all =
        inner_->allgather(&mine, sizeof mine, detail::concat("--debug-collectives: comparing ", describe(mine)));
    std::vector<Call> calls(size_t(inner_->size()));
    std::memcpy(calls.data(), all.data(), all.size());
    for (int r = 1; r < inner_->size(); ++r) {
      if (same(calls[0], calls[size_t(r)])) continue;
      // Every rank saw the same calls and says the same: the first rank
      // that differs from rank 0.
      throw CollectiveError(detail::concat("--debug-collectives: the ranks' collectives differ: rank 0's ",
                                           describe(calls[0]), ", rank ", r, "'s ", describe(calls[size_t(r)]),
                                           "; every rank must issue the same collectives in the same order"));
    }
  }

  std::unique_ptr<Communicator> inner_;
  uint64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_checked_communicator(std::unique_ptr<Communicator> inner) {
  return std::make_unique<CheckedCommunicator>(std::move(inner));
}

}  // namespace ddp::comm
