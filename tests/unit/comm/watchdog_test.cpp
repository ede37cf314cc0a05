// The watchdog's parts without MPI (comm/watchdog.hpp): the report it ends a
// job with, from tables of what each rank said; the numbering of collectives
// (the tracker, src/comm/watched.hpp); the watched communicator over a
// recording one. tests/mpi/ddp/watchdog_test.cpp runs the channel on real
// ranks, and tests/cli/test_reliability.cpp stops a rank of a real job.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../../src/comm/watched.hpp"  // Tracker, Watched: private to src/comm
#include "ddp/comm/watchdog.hpp"
#include "ddp/core/error.hpp"

namespace ddp::comm {
namespace {

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "\"" << part << "\" not in:\n" << text;
}

RankView rank_view(int r, uint64_t entered, uint64_t pending, double pending_s, double heard_ago = 0.5) {
  RankView v;
  v.rank = r;
  v.host = "node" + std::to_string(r / 2);
  v.pid = 1000 + r;
  v.heard_ago_s = heard_ago;
  v.entered_seq = entered;
  v.entered = "all-reduce of bucket " + std::to_string(entered % 3) + " of 3 (parameters 0..1: a .. b), 1.0 KiB";
  v.pending_seq = pending;
  if (pending) v.pending = "all-reduce of bucket 2 of 3 (parameters 4..9: fc1.bias .. conv2.weight), 198.0 KiB";
  v.pending_s = pending_s;
  v.pending_limit_s = 20;
  v.idle_s = pending ? 0 : 3;
  return v;
}

TEST(StallReport, NothingWhileEveryCollectiveIsWithinItsTimeout) {
  std::vector<RankView> ranks = {rank_view(0, 41, 41, 19.5), rank_view(1, 41, 41, 19.4), rank_view(2, 40, 0, 0)};
  EXPECT_EQ(stall_report(ranks, 20, 5), "");
  ranks[2].heard_ago_s = 19.9;  // quiet, not yet silent
  EXPECT_EQ(stall_report(ranks, 20, 5), "");
}

// SIGSTOP of rank 2: it falls silent, the others wait for the collective it
// never entered.
TEST(StallReport, ASilentRankIsNamedAsNotArrivedWithTheCollective) {
  const std::vector<RankView> ranks = {rank_view(0, 42, 42, 20.2), rank_view(1, 42, 42, 20.1),
                                       rank_view(2, 41, 0, 0, /*heard_ago=*/20.6), rank_view(3, 42, 42, 20.3)};
  const std::string r = stall_report(ranks, 20, 5);
  expect_contains(r, "watchdog: collective #42 has not completed after 20.3 s (--timeout 20.0 s)");
  expect_contains(r, "\n  collective #42: all-reduce of bucket 2 of 3 (parameters 4..9: fc1.bias .. conv2.weight), "
                     "198.0 KiB; waiting for 20.3 s");
  expect_contains(r, "\n  reached it: ranks 0, 1, 3");
  expect_contains(r, "\n  not arrived: rank 2 on host node1, pid 1002: not heard from for 20.6 s (stopped or dead); "
                     "at its last report it had entered #41, all-reduce of bucket 2 of 3");
  EXPECT_EQ(r.find("rank 0 on host"), std::string::npos) << r;
}

// Stopped a second after the others entered: when the collective's timeout
// fires, its silence is a second short of --timeout. Several intervals of
// silence already say it is not working, so it is named as not heard from,
// not as alive.
TEST(StallReport, ARankQuietForSeveralIntervalsIsNotCalledAlive) {
  const std::vector<RankView> ranks = {rank_view(0, 42, 42, 20.0), rank_view(1, 42, 42, 20.1),
                                       rank_view(2, 41, 0, 0, /*heard_ago=*/19.0), rank_view(3, 42, 42, 19.9)};
  const std::string r = stall_report(ranks, 20, 5);
  expect_contains(r, "\n  reached it: ranks 0, 1, 3\n");
  expect_contains(r, "\n  not arrived: rank 2 on host node1, pid 1002: not heard from for 19.0 s (stopped or dead)");
  // Quiet for less than that: alive, busy elsewhere.
  std::vector<RankView> busy = ranks;
  busy[2].heard_ago_s = 4.0;
  expect_contains(stall_report(busy, 20, 5),
                  "\n  not arrived: rank 2 on host node1, pid 1002: alive (heard from 4.0 s ago)");
  // Silence alone still ends the job only after --timeout.
  busy[0].pending_s = busy[1].pending_s = busy[3].pending_s = 10;
  busy[2].heard_ago_s = 19.0;
  EXPECT_EQ(stall_report(busy, 20, 5), "");
}

// A rank that is alive but elsewhere (a long checkpoint write, a loop that
// forgot a collective): named as busy, with how long, not as dead.
TEST(StallReport, ABusyRankIsNamedAsAliveOutsideCollectives) {
  std::vector<RankView> ranks = {rank_view(0, 7, 0, 0), rank_view(1, 8, 8, 25)};
  ranks[0].idle_s = 24.5;
  const std::string r = stall_report(ranks, 20, 5);
  expect_contains(r, "watchdog: collective #8 has not completed after 25.0 s (--timeout 20.0 s)");
  expect_contains(r, "\n  reached it: rank 1");
  expect_contains(r, "\n  not arrived: rank 0 on host node0, pid 1000: alive (heard from 0.5 s ago), busy outside "
                     "collectives for 24.5 s; last collective entered: #7");
}

// Stopped inside the collective: its last report said it had entered it,
// but it is not taking part; it holds the collective up all the same.
TEST(StallReport, ARankSilentInsideTheCollectiveStillHoldsItUp) {
  const std::vector<RankView> ranks = {rank_view(0, 42, 42, 21), rank_view(1, 42, 42, 0, /*heard_ago=*/21)};
  const std::string r = stall_report(ranks, 20, 5);
  expect_contains(r, "reached it: rank 0\n");
  expect_contains(r, "not arrived: rank 1 on host node0, pid 1001: not heard from for 21.0 s (stopped or dead); "
                     "at its last report it had entered #42 (this one), ");
}

TEST(StallReport, SilenceAloneEndsTheJobEvenWithNothingWaiting) {
  std::vector<RankView> ranks = {rank_view(0, 5, 0, 0), rank_view(1, 5, 0, 0), rank_view(2, 4, 0, 0, 30)};
  const std::string r = stall_report(ranks, 20, 5);
  expect_contains(r, "watchdog: rank 2 not heard from for more than 20.0 s (--timeout 20.0 s)");
  expect_contains(r, "\n  rank 2 on host node1, pid 1002: not heard from for 30.0 s (stopped or dead); "
                     "at its last report it had entered #4, ");
  EXPECT_EQ(r.find("reached it"), std::string::npos) << r;
  // A rank that said goodbye (its training ended) is not silent.
  ranks[2].finished = true;
  EXPECT_EQ(stall_report(ranks, 20, 5), "");
}

// The collective named is the oldest one still waited for, by sequence.
TEST(StallReport, TheOldestCollectiveWaitedForIsTheOneNamed) {
  const std::vector<RankView> ranks = {rank_view(0, 12, 11, 30), rank_view(1, 10, 0, 0), rank_view(2, 12, 12, 5)};
  const std::string r = stall_report(ranks, 20, 5);
  expect_contains(r, "watchdog: collective #11 has not completed after 30.0 s");
  expect_contains(r, "reached it: ranks 0, 2");
  expect_contains(r, "not arrived: rank 1 ");
}

TEST(CollectiveLabel, KindOnlyWhereTheNameDoesNotSayIt) {
  EXPECT_EQ(collective_label("all-reduce", "all-reduce of bucket 0 of 2 (parameters 0..3)", "1.0 KiB"),
            "all-reduce of bucket 0 of 2 (parameters 0..3), 1.0 KiB");
  EXPECT_EQ(collective_label("barrier", "end of training", "0 B"), "barrier (end of training), 0 B");
}

TEST(Tracker, NumbersOutermostCallsOfItsOwnThreadOnly) {
  Tracker t;
  EXPECT_EQ(t.enter("a", 20), 1u);
  {
    Tracker::Nested inside;
    EXPECT_EQ(t.enter("inner", 20), 0u);  // a delegated call: not counted
  }
  uint64_t other = 99;
  std::thread([&] { other = t.enter("staging thread", 20); }).join();
  EXPECT_EQ(other, 0u);
  EXPECT_EQ(t.enter("b", 20), 2u);
  TrackerSnapshot s = t.snapshot();
  EXPECT_EQ(s.entered_seq, 2u);
  EXPECT_EQ(s.entered, "b");
  EXPECT_EQ(s.pending_seq, 1u);  // the oldest not complete
  EXPECT_EQ(s.pending, "a");
  EXPECT_EQ(s.pending_limit_s, 20);
  t.complete(1);
  s = t.snapshot();
  EXPECT_EQ(s.pending_seq, 2u);
  t.complete(2);
  s = t.snapshot();
  EXPECT_EQ(s.pending_seq, 0u);
  EXPECT_EQ(s.entered_seq, 2u);
}

// A collective whose communicator has failed (NCCL's done() throws then):
// the watchdog's thread polls it and keeps it pending, where an exception
// out of that thread would end the process without the error line.
TEST(Tracker, ASnapshotKeepsWorkWhoseDoneThrowsPending) {
  struct FailedWork : Work {
    void wait() override { throw Error("all-reduce: the communicator has failed"); }
    bool done() override { throw Error("all-reduce: the communicator has failed"); }
  };
  Tracker t;
  ASSERT_EQ(t.enter("bucket 0", 20), 1u);
  t.attach(1, std::make_shared<FailedWork>());
  TrackerSnapshot s;
  EXPECT_NO_THROW(s = t.snapshot());
  EXPECT_EQ(s.pending_seq, 1u);
  EXPECT_EQ(s.pending, "bucket 0");
}

class FlagWork : public Work {
 public:
  void wait() override { finished = true; }
  bool done() override { return finished; }
  bool finished = false;
};

// A world of one that records what it is asked and with which timeout.
class Recorder : public Communicator {
 public:
  const char* backend() const override { return "recorder"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::shared_ptr<Work> allreduce_async(float*, size_t, ReduceOp, std::string what) override {
    calls.push_back(what);
    timeouts.push_back(timeout());
    auto w = std::make_shared<FlagWork>();
    works.push_back(w);
    return w;
  }
  void broadcast(void*, size_t, int, const std::string& what) override {
    calls.push_back(what);
    timeouts.push_back(timeout());
  }
  void barrier(const std::string& what) override { calls.push_back(what); }
  std::vector<char> allgather(const void*, size_t, const std::string& what) override {
    calls.push_back(what);
    return {};
  }
  void allreduce_doubles(double*, size_t, bool, const std::string& what) override { calls.push_back(what); }
  void allreduce_int64(int64_t*, size_t, const std::string& what) override { calls.push_back(what); }
  std::vector<std::string> calls;
  std::vector<std::chrono::milliseconds> timeouts;
  std::vector<std::shared_ptr<FlagWork>> works;
};

TEST(Watched, NumbersEachCollectiveAndLeavesTheBackstopToTheInnerOne) {
  auto tracker = std::make_shared<Tracker>();
  auto rec = std::make_unique<Recorder>();
  Recorder& inner = *rec;
  Watched<Communicator> w(std::move(rec), tracker, std::chrono::seconds(10));
  w.set_timeout(std::chrono::seconds(20));
  float x[256] = {};
  auto work = w.allreduce_async(x, 256, ReduceOp::Avg, "all-reduce of bucket 0 of 1 (parameters 0..1: w .. b)");
  int v = 0;
  w.broadcast(&v, sizeof v, 0, "the parameters");
  ASSERT_EQ(inner.calls.size(), 2u);
  EXPECT_EQ(inner.calls[0], "all-reduce of bucket 0 of 1 (parameters 0..1: w .. b)");  // the caller's name, as given
  EXPECT_EQ(inner.timeouts[0], std::chrono::seconds(30));                              // --timeout + grace
  TrackerSnapshot s = tracker->snapshot();
  EXPECT_EQ(s.entered_seq, 2u);
  EXPECT_EQ(s.entered, "broadcast (the parameters, from rank 0), 4 B");
  EXPECT_EQ(s.pending_seq, 1u);  // the all-reduce, not yet done; the broadcast returned
  EXPECT_EQ(s.pending, "all-reduce of bucket 0 of 1 (parameters 0..1: w .. b), 1.0 KiB");
  // Complete when the operation says so, whether or not it was waited for.
  inner.works[0]->finished = true;
  EXPECT_EQ(tracker->snapshot().pending_seq, 0u);
  work->wait();
  EXPECT_EQ(tracker->snapshot().pending_seq, 0u);
}

// A device all-reduce's wait() returns at once, the collective still in
// flight on the GPU (Note [device all-reduce order]): it stays the pending
// collective until it is done, so that ranks whose GPUs wait on a stopped
// peer name the collective they wait for (On/Reliability.*/nccl_on_one_gpu).
TEST(Watched, ADeviceAllReduceWaitedForStaysPendingUntilDone) {
  struct OrderingWork : FlagWork {
    void wait() override {}  // the compute stream waits; the host does not
  };
  struct Device : Recorder {
    std::shared_ptr<Work> allreduce_async(float*, size_t, ReduceOp, std::string what) override {
      calls.push_back(what);
      auto w = std::make_shared<OrderingWork>();
      works.push_back(w);
      return w;
    }
  };
  auto tracker = std::make_shared<Tracker>();
  auto dev = std::make_unique<Device>();
  Device& inner = *dev;
  Watched<Communicator> w(std::move(dev), tracker, std::chrono::seconds(10));
  float x[4] = {};
  w.allreduce_async(x, 4, ReduceOp::Avg, "all-reduce of bucket 0 of 1 (parameters 0..1: w .. b)")->wait();
  int v = 0;
  w.broadcast(&v, sizeof v, 0, "the parameters");
  TrackerSnapshot s = tracker->snapshot();
  EXPECT_EQ(s.entered_seq, 2u);
  EXPECT_EQ(s.pending_seq, 1u);
  EXPECT_EQ(s.pending, "all-reduce of bucket 0 of 1 (parameters 0..1: w .. b), 16 B");
  inner.works[0]->finished = true;
  EXPECT_EQ(tracker->snapshot().pending_seq, 0u);
}

}  // namespace
}  // namespace ddp::comm
