// Reducer against a recording communicator: which buckets are launched when,
// without MPI. The MPI tests check the arithmetic on real ranks.
#include <gtest/gtest.h>

#include <cstring>

#include "ddp/core/error.hpp"
#include "ddp/reducer/reducer.hpp"
#include "../one_rank.hpp"

namespace ddp {
namespace {

using test::DoneWork;

struct Launch {
  size_t offset, count;
  std::string what;
};

// A world of one that records every all-reduce it is asked for.
class Recorder : public test::OneRank {
 public:
  explicit Recorder(const float* base) : base_(base) {}
  std::shared_ptr<comm::Work> allreduce_async(float* data, size_t count, comm::ReduceOp op,
                                              std::string what) override {
    EXPECT_EQ(op, comm::ReduceOp::Avg);
    launches.push_back({size_t(data - base_), count, what});
    auto w = std::make_shared<DoneWork>();
    works.push_back(w);
    return w;
  }

  std::vector<Launch> launches;
  std::vector<std::shared_ptr<DoneWork>> works;

 private:
  const float* base_;
};

// 6 params of 100 floats, cap 800 bytes = 2 params per bucket: buckets
// [0,200) [200,400) [400,600).
const std::vector<size_t> kNumels(6, 100);
constexpr double kCapMb = 800.0 / (1024 * 1024);

TEST(Reducer, PlansTwoParamsPerBucket) {
  std::vector<float> g(600);
  Recorder rec(g.data());
  Reducer red(rec, g.data(), kNumels, kCapMb);
  ASSERT_EQ(red.buckets().size(), 3u);
  EXPECT_EQ(red.buckets()[1].begin, 200u);
  EXPECT_EQ(red.buckets()[1].end, 400u);
}

TEST(Reducer, GradsReadyLaunchesWholeBucketsInOrder) {
  std::vector<float> g(600);
  Recorder rec(g.data());
  Reducer red(rec, g.data(), kNumels, kCapMb);
  red.begin_backward();
  red.grads_ready(100);  // half of bucket 0: nothing
  EXPECT_TRUE(rec.launches.empty());
  red.grads_ready(200);
  ASSERT_EQ(rec.launches.size(), 1u);
  red.grads_ready(200);  // repeated: nothing new
  EXPECT_EQ(rec.launches.size(), 1u);
  red.grads_ready(600);  // two at once, in index order
  ASSERT_EQ(rec.launches.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(rec.launches[k].offset, 200 * k);
    EXPECT_EQ(rec.launches[k].count, 200u);
    EXPECT_NE(rec.launches[k].what.find("bucket " + std::to_string(k)), std::string::npos)
        << rec.launches[k].what;
  }
  ReducerStats s = red.finish();
  EXPECT_EQ(s.buckets_launched_early, 3);
  EXPECT_EQ(rec.launches.size(), 3u);
  for (auto& w : rec.works) EXPECT_EQ(w->waits, 1);
}

TEST(Reducer, FinishLaunchesTheRest) {
  std::vector<float> g(600);
  Recorder rec(g.data());
  Reducer red(rec, g.data(), kNumels, kCapMb);
  red.begin_backward();
  red.grads_ready(450);
  EXPECT_EQ(rec.launches.size(), 2u);
  ReducerStats s = red.finish();
  EXPECT_EQ(s.buckets_launched_early, 2);
  ASSERT_EQ(rec.launches.size(), 3u);
  EXPECT_EQ(rec.launches[2].offset, 400u);
  for (auto& w : rec.works) EXPECT_EQ(w->waits, 1);

  // The next step starts from bucket 0 again.
  red.begin_backward();
  red.grads_ready(200);
  ASSERT_EQ(rec.launches.size(), 4u);
  EXPECT_EQ(rec.launches[3].offset, 0u);
  red.finish();
  EXPECT_EQ(rec.launches.size(), 6u);
}

TEST(Reducer, NoOverlapDefersEverythingToFinish) {
  std::vector<float> g(600);
  Recorder rec(g.data());
  Reducer red(rec, g.data(), kNumels, kCapMb, /*overlap=*/false);
  red.begin_backward();
  red.grads_ready(600);
  EXPECT_TRUE(rec.launches.empty());
  ReducerStats s = red.finish();
  EXPECT_EQ(s.buckets_launched_early, 0);
  ASSERT_EQ(rec.launches.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(rec.launches[k].offset, 200 * k);
}

TEST(Reducer, NoSyncCommunicatesNothing) {
  std::vector<float> g(600);
  Recorder rec(g.data());
  Reducer red(rec, g.data(), kNumels, kCapMb);
  red.set_sync(false);
  for (int step = 0; step < 3; ++step) {
    red.begin_backward();
    red.grads_ready(300);
    red.grads_ready(600);
    red.finish();
  }
  EXPECT_TRUE(rec.launches.empty());
  red.set_sync(true);
  red.begin_backward();
  red.grads_ready(600);
  red.finish();
  EXPECT_EQ(rec.launches.size(), 3u);
}

TEST(Reducer, SyncTurnedOffMidStepStillCompletesTheStep) {
  std::vector<float> g(600);
  Recorder rec(g.data());
  Reducer red(rec, g.data(), kNumels, kCapMb);
  red.begin_backward();
  red.grads_ready(200);
  red.set_sync(false);
  red.finish();
  EXPECT_EQ(rec.launches.size(), 3u);
}

TEST(Reducer, BeginBackwardWithBucketsInFlightIsAnError) {
  std::vector<float> g(600);
  Recorder rec(g.data());
  Reducer red(rec, g.data(), kNumels, kCapMb);
  red.begin_backward();
  red.grads_ready(400);
  EXPECT_THROW(red.begin_backward(), Error);
}

TEST(Reducer, ReadyBeyondTheBufferIsAnError) {
  std::vector<float> g(600);
  Recorder rec(g.data());
  Reducer red(rec, g.data(), kNumels, kCapMb);
  red.begin_backward();
  EXPECT_THROW(red.grads_ready(601), Error);
}

TEST(Reducer, NonPositiveCapIsAnError) {
  std::vector<float> g(600);
  Recorder rec(g.data());
  EXPECT_THROW(Reducer(rec, g.data(), kNumels, 0.0), Error);
  EXPECT_THROW(Reducer(rec, g.data(), kNumels, -1.0), Error);
}

TEST(Reducer, DefaultFirstBucketIsAtMostOneMiB) {
  // 8 params of 256 Ki floats (1 MiB each) with the default 25 MiB cap:
  // the first bucket holds one, the rest go in one.
  const std::vector<size_t> n(8, size_t(1) << 18);
  std::vector<float> g(8u << 18);
  Recorder rec(g.data());
  Reducer red(rec, g.data(), n, 25.0);
  ASSERT_EQ(red.buckets().size(), 2u);
  EXPECT_EQ(red.buckets()[0].last_param, 1u);
}

}  // namespace
}  // namespace ddp
