// --deterministic's fixed-point arithmetic (deterministic/exact_sum.hpp), without MPI;
// tests/mpi/ddp/exact_sum_test.cpp checks the sums on real ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"
#include "ddp/deterministic/exact_sum.hpp"
#include "ddp/core/fixed_point.hpp"
#include "../one_rank.hpp"
#include "add_shard.hpp"

namespace ddp {
namespace {

TEST(FixedPoint, LimitLeavesRoomForEveryShard) {
  EXPECT_EQ(fixed_point_limit_bits(1), 62);
  EXPECT_EQ(fixed_point_limit_bits(2), 61);
  EXPECT_EQ(fixed_point_limit_bits(16), 58);
  EXPECT_EQ(fixed_point_limit_bits(17), 57);
  // K elements each below 2^limit sum below 2^62: no int64 overflow.
  for (int k : {1, 3, 16, 1000, 1 << 20})
    EXPECT_LE(std::ldexp(double(k), fixed_point_limit_bits(k)), std::ldexp(1.0, 62)) << k;
}

TEST(FixedPoint, ExponentPutsTheLargestElementBelowTheHeadroom) {
  const int limit = fixed_point_limit_bits(16);
  for (double m : {1e-30, 3e-7, 0.75, 1.0, 5.0, 1e20}) {
    const int e = fixed_point_exponent(m, limit);
    EXPECT_LT(m * std::ldexp(1.0, e), std::ldexp(1.0, limit - kHeadroomBits)) << m;
    EXPECT_GE(m * std::ldexp(1.0, e), std::ldexp(1.0, limit - kHeadroomBits - 1)) << m;
  }
  EXPECT_EQ(fixed_point_exponent(1e-300, limit), kMaxExponent);
}

TEST(FixedPoint, QuantizeRoundsToNearestEvenAndSkipsWhatDoesNotFit) {
  const float g[5] = {1.5f, 2.5f, -1.5f, 0.25f, 300.0f};
  std::vector<int64_t> acc(5, 10);
  // 2^0: 1.5 -> 2, 2.5 -> 2, -1.5 -> -2, 0.25 -> 0; 300 is beyond 2^8.
  const double max = quantize_add(g, 5, 0, 8, acc.data());
  EXPECT_EQ(max, 300.0);
  EXPECT_EQ(acc, (std::vector<int64_t>{12, 12, 8, 10, 10}));
  const float bad[2] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(quantize_add(bad, 2, 0, 8, acc.data()), std::numeric_limits<double>::infinity());
}

// quantize_add runs eight elements at a time where the CPU can: whatever the
// length and wherever a tie, an overflow, a NaN or an infinity falls, it is
// to_fixed element by element and the largest |g| (the GPU's arithmetic too).
TEST(FixedPoint, QuantizeIsToFixedElementByElementAtAnyLength) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.5f, 1.5f, -2.5f, 255.0f, 256.0f, -300.0f, 1e-40f, -0.0f, nan, inf, -inf, 3.75f};
  const int limit_bits = 8, exponent = 0;
  const double scale = std::ldexp(1.0, exponent), limit = std::ldexp(1.0, limit_bits);
  for (size_t n = 0; n <= 37; ++n)
    for (size_t at = 0; at < std::max<size_t>(n, 1); at += 5)
      for (const float special : specials) {
        std::vector<float> g(n);
        for (size_t i = 0; i < n; ++i) g[i] = float(int(i * 37 % 101) - 50) * 0.37f;  // ties and fractions
        if (at < n) g[at] = special;
        std::vector<int64_t> got(n), want(n);
        for (size_t i = 0; i < n; ++i) got[i] = want[i] = int64_t(i) * 1000 - 7;
        float max = 0;
        bool finite = true;
        for (size_t i = 0; i < n; ++i) {
          finite &= std::isfinite(g[i]);
          if (std::isfinite(g[i])) max = std::max(max, std::fabs(g[i]));
          int64_t q;
          if (fixed_point::to_fixed(g[i], scale, limit, &q)) want[i] += q;
        }
        const double m = quantize_add(g.data(), n, exponent, limit_bits, got.data());
        ASSERT_EQ(got, want) << "n " << n << ", " << special << " at " << at;
        ASSERT_EQ(m, finite ? double(max) : std::numeric_limits<double>::infinity())
            << "n " << n << ", " << special << " at " << at;
      }
}

// The GPU keeps a tensor's largest |g| as an integer maximum of these bits
// (deterministic/exact_sum_cuda.cu): they must order as the magnitudes do, and a NaN or an
// infinity must come out as infinity's, which the host reads as non-finite.
TEST(FixedPoint, MagnitudeBitsOrderAsMagnitudesAndMakeNonFiniteInfinite) {
  const std::vector<float> up = {0.0f, 1e-45f, 1e-38f, 3e-7f, 0.5f, 1.0f, 1.0000001f, 7e30f,
                                 std::numeric_limits<float>::max()};
  for (size_t i = 1; i < up.size(); ++i) {
    EXPECT_LT(fixed_point::magnitude_bits(up[i - 1]), fixed_point::magnitude_bits(up[i])) << up[i];
    EXPECT_EQ(fixed_point::magnitude_bits(-up[i]), fixed_point::magnitude_bits(up[i])) << up[i];
  }
  const uint32_t inf = fixed_point::magnitude_bits(std::numeric_limits<float>::infinity());
  EXPECT_GT(inf, fixed_point::magnitude_bits(std::numeric_limits<float>::max()));
  EXPECT_EQ(fixed_point::magnitude_bits(std::numeric_limits<float>::quiet_NaN()), inf);
  EXPECT_EQ(fixed_point::magnitude_bits(-std::numeric_limits<float>::quiet_NaN()), inf);
  EXPECT_EQ(fixed_point::magnitude_bits(-std::numeric_limits<float>::infinity()), inf);
}

// The loss sums --deterministic adds: multiples of 2^-20, nearest, ties to
// even, so any order of adding them gives the same double.
TEST(FixedPoint, LossSumsRoundToMultiplesOfTwoToTheMinusTwenty) {
  const double q = std::ldexp(1.0, -20);
  EXPECT_EQ(fixed_point::round_loss_sum(3.0), 3.0);
  EXPECT_EQ(fixed_point::round_loss_sum(3.0 + 0.4 * q), 3.0);
  EXPECT_EQ(fixed_point::round_loss_sum(3.0 + 0.6 * q), 3.0 + q);
  EXPECT_EQ(fixed_point::round_loss_sum(0.5 * q), 0.0);  // a tie: to even
  EXPECT_EQ(fixed_point::round_loss_sum(1.5 * q), 2 * q);
  Rng rng(9, 0);
  std::vector<double> v(1000);
  for (auto& x : v) x = fixed_point::round_loss_sum(std::fabs(rng.normal()) * 300.0);
  double forward = 0, backward = 0;
  for (double x : v) forward += x;
  for (auto it = v.rbegin(); it != v.rend(); ++it) backward += *it;
  EXPECT_EQ(forward, backward);
}

TEST(FixedPoint, DequantizeInvertsQuantizeForFloatsThatFit) {
  Rng rng(5, 0);
  std::vector<float> g(1000);
  for (auto& v : g) v = float(rng.normal() * 1e-3);
  std::vector<int64_t> acc(g.size(), 0);
  const int e = fixed_point_exponent(quantize_add(g.data(), g.size(), 0, 62, std::vector<int64_t>(g.size()).data()),
                                     fixed_point_limit_bits(16));
  quantize_add(g.data(), g.size(), e, fixed_point_limit_bits(16), acc.data());
  std::vector<float> back(g.size());
  dequantize(acc.data(), acc.size(), e, back.data());
  EXPECT_EQ(back, g);  // 50 bits at the top element: every float of these fits exactly
}

std::vector<float> shard_grads(int shard, size_t n, double scale) {
  Rng rng(11, uint64_t(shard));
  std::vector<float> g(n);
  for (auto& v : g) v = float(rng.normal() * scale);
  return g;
}

TEST(ExactGradientSum, TheSumDoesNotDependOnTheOrderOfTheShards) {
  const std::vector<size_t> numels = {300, 7, 1000};
  const size_t n = 1307;
  const int k = 16;
  test::OneRank one;
  auto run = [&](const std::vector<int>& order) {
    HostExactGradientSum sum(numels, k);
    std::vector<float> out(n);
    for (int step = 0; step < 3; ++step) {
      sum.begin_step();
      for (int s : order) test::add_shard(sum, numels, shard_grads(s, n, 1e-2).data());
      EXPECT_EQ(sum.finish(one, out.data()), ExactGradientSum::Result::Done) << "step " << step;
    }
    return out;
  };
  std::vector<int> forward, backward;
  for (int s = 0; s < k; ++s) forward.push_back(s);
  backward.assign(forward.rbegin(), forward.rend());
  EXPECT_EQ(run(forward), run(backward));
  // Float sums of the same shards in these two orders do differ: the data
  // would show an order dependence if there were one.
  std::vector<float> f(n, 0), b(n, 0);
  for (int s : forward) {
    const auto g = shard_grads(s, n, 1e-2);
    for (size_t i = 0; i < n; ++i) f[i] += g[i];
  }
  for (int s : backward) {
    const auto g = shard_grads(s, n, 1e-2);
    for (size_t i = 0; i < n; ++i) b[i] += g[i];
  }
  EXPECT_NE(f, b);
}

// Note [lanes] (deterministic/shards.hpp): micro-shards added from several threads at
// once, each on a lane of its own and op by op (params 0-1, then 2), by add
// or converted into the lane's sinks (Note [fixed-point epilogue]), fold
// into the same sums as one lane adding all of them, and a lane that
// outgrows an exponent is seen.
TEST(ExactGradientSum, LanesAddingAtOnceGiveOneLanesSums) {
  const std::vector<size_t> numels = {300, 7, 1000};
  const size_t n = 1307;
  const int k = 12;
  test::OneRank one;
  std::vector<float> alone(n), laned(n);
  HostExactGradientSum a(numels, k);
  a.begin_step();
  for (int s = 0; s < k; ++s) test::add_shard(a, numels, shard_grads(s, n, 1e-2).data());
  a.begin_step();  // a second step: the first one's sums are gone
  for (int s = 0; s < k; ++s) test::add_shard(a, numels, shard_grads(s, n, 1e-2).data());
  ASSERT_EQ(a.finish(one, alone.data()), ExactGradientSum::Result::Done);

  HostExactGradientSum b(numels, k);
  b.set_lanes(3);
  ASSERT_EQ(b.lanes(), 3);
  std::vector<std::vector<float>> g;
  for (int s = 0; s < k; ++s) g.push_back(shard_grads(s, n, 1e-2));
  for (int step = 0; step < 2; ++step) {
    b.begin_step();
    for (const auto& [first, count, offset] : {std::tuple<size_t, size_t, size_t>{0, 2, 0}, {2, 1, 307}}) {
      std::vector<std::thread> lanes;
      for (int lane = 0; lane < 3; ++lane)
        lanes.emplace_back([&, lane, first = first, count = count, offset = offset] {
          for (int s = lane; s < k; s += 3) {
            if (lane == 2) {
              b.add(lane, g[size_t(s)].data() + offset, first, count);
              continue;
            }
            // Lanes 0 and 1 convert into their sinks themselves, as a
            // kernel with a fixed-point epilogue does.
            std::vector<fixed_point::Sink> to(count);
            ASSERT_TRUE(b.sinks(lane, first, count, to.data()));
            for (size_t p = first, at = offset; p < first + count; at += numels[p], ++p)
              fixed_point::quantize_add(g[size_t(s)].data() + at, numels[p], to[p - first]);
          }
        });
      for (auto& t : lanes) t.join();
      b.fold(first, count);
    }
  }
  ASSERT_EQ(b.finish(one, laned.data()), ExactGradientSum::Result::Done);
  EXPECT_EQ(laned, alone);

  // Lane 2's shard outgrows the exponents: the step is redone.
  b.begin_step();
  std::vector<float> big = g[0];
  big[1000] = 1e30f;
  b.add(2, big.data(), 0, 3);
  b.fold(0, 3);
  EXPECT_EQ(b.finish(one, laned.data()), ExactGradientSum::Result::Redo);
  EXPECT_THROW(b.add(3, g[0].data(), 0, 3), Error) << "there is no lane 3";
}

// A world of one that records the integer sums started, each a Work that
// counts its waits.
class RecordingRank : public test::OneRank {
 public:
  std::shared_ptr<comm::Work> allreduce_int64_async(int64_t*, size_t count, std::string) override {
    counts.push_back(count);
    works.push_back(std::make_shared<test::DoneWork>());
    return works.back();
  }
  std::vector<size_t> counts;
  std::vector<std::shared_ptr<test::DoneWork>> works;
};

// Note [overlapped sums]: params marked ready start their sums at once, as
// backward goes on; finish starts the rest, waits for every one, and gives
// what a step with none started early gives. A redone step waits for what it
// started, then drops it.
TEST(ExactGradientSum, ReadyParamsStartTheirSumsAtOnceAndFinishTheRest) {
  const std::vector<size_t> numels = {300, 7, 1000};
  const size_t n = 1307;
  const int k = 4;
  test::OneRank one;
  HostExactGradientSum plain(numels, k), early(numels, k);
  std::vector<float> want(n), got(n);
  plain.begin_step();
  for (int s = 0; s < k; ++s) test::add_shard(plain, numels, shard_grads(s, n, 1e-2).data());
  ASSERT_EQ(plain.finish(one, want.data()), ExactGradientSum::Result::Done);

  RecordingRank rec;
  early.begin_step();
  for (int s = 0; s < k; ++s) test::add_shard(early, numels, shard_grads(s, n, 1e-2).data(), 2, 1);
  early.ready(rec, 2, 1);  // backward's order: the last params first
  EXPECT_EQ(rec.counts, std::vector<size_t>{1000});
  for (int s = 0; s < k; ++s) test::add_shard(early, numels, shard_grads(s, n, 1e-2).data(), 0, 2);
  ASSERT_EQ(early.finish(rec, got.data()), ExactGradientSum::Result::Done);
  EXPECT_EQ(rec.counts, (std::vector<size_t>{1000, 307}));
  for (const auto& w : rec.works) EXPECT_EQ(w->waits, 1);
  EXPECT_EQ(got, want);
  EXPECT_THROW(early.ready(rec, 3, 1), Error) << "there is no parameter 3";

  // Too large for the exponents: the started sums are waited for and dropped.
  rec.counts.clear();
  rec.works.clear();
  early.begin_step();
  for (int s = 0; s < k; ++s) test::add_shard(early, numels, shard_grads(s, n, 1e6).data());
  early.ready(rec, 0, 3);
  ASSERT_EQ(early.finish(rec, got.data()), ExactGradientSum::Result::Redo);
  EXPECT_EQ(rec.counts, std::vector<size_t>{n});
  ASSERT_EQ(rec.works.size(), 1u);
  EXPECT_EQ(rec.works[0]->waits, 1);
}

// A failed communicator, as NCCL's after an error: its work throws on
// wait() and on done().
class FailedRank : public test::OneRank {
 public:
  struct FailedWork : comm::Work {
    void wait() override { throw Error("int64 all-reduce: the communicator has failed"); }
    bool done() override { throw Error("int64 all-reduce: the communicator has failed"); }
  };
  std::shared_ptr<comm::Work> allreduce_int64_async(int64_t*, size_t, std::string) override {
    return std::make_shared<FailedWork>();
  }
};

// A sum in flight when its communicator fails: finish reports the failure,
// and the store is destroyed while the error unwinds (its memory left to
// the collective that may still write it), not ended by std::terminate.
TEST(ExactGradientSum, ASumWhoseCommunicatorFailedIsDestroyedWithoutThrowing) {
  const std::vector<size_t> numels = {300, 7};
  FailedRank failed;
  std::vector<float> got(307);
  EXPECT_THROW(
      {
        HostExactGradientSum sum(numels, 2);
        sum.begin_step();
        for (int s = 0; s < 2; ++s) test::add_shard(sum, numels, shard_grads(s, 307, 1e-2).data());
        sum.ready(failed, 0, 2);
        sum.finish(failed, got.data());
      },
      Error);
}

TEST(ExactGradientSum, AGradientThatOutgrowsItsExponentRedoesTheStepThenFits) {
  const std::vector<size_t> numels = {100};
  HostExactGradientSum sum(numels, 4);
  test::OneRank one;
  std::vector<float> out(100);
  // The first step's exponents take |g| < 2^kHeadroomBits: ~3000 does not fit.
  auto step = [&] {
    sum.begin_step();
    for (int s = 0; s < 4; ++s) test::add_shard(sum, numels, shard_grads(s, 100, 1000.0).data());
    return sum.finish(one, out.data());
  };
  EXPECT_EQ(step(), ExactGradientSum::Result::Redo);
  EXPECT_EQ(step(), ExactGradientSum::Result::Done);
  std::vector<double> want(100, 0);
  for (int s = 0; s < 4; ++s) {
    const auto g = shard_grads(s, 100, 1000.0);
    for (size_t i = 0; i < 100; ++i) want[i] += g[i];
  }
  for (size_t i = 0; i < 100; ++i) EXPECT_NEAR(out[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-12) << i;
}

TEST(ExactGradientSum, ANonFiniteGradientFillsTheResultWithNaN) {
  const std::vector<size_t> numels = {10};
  HostExactGradientSum sum(numels, 2);
  test::OneRank one;
  std::vector<float> g(10, 0.5f), out(10, 0);
  sum.begin_step();
  test::add_shard(sum, numels, g.data());
  g[3] = std::numeric_limits<float>::infinity();
  test::add_shard(sum, numels, g.data());
  EXPECT_EQ(sum.finish(one, out.data()), ExactGradientSum::Result::NonFinite);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
}

TEST(ExactGradientSum, ExponentsComeBackFromACheckpointAndAreChecked) {
  HostExactGradientSum sum({10, 20}, 2);
  sum.set_exponents({3, -7});
  EXPECT_EQ(sum.exponents(), (std::vector<int64_t>{3, -7}));
  EXPECT_THROW(sum.set_exponents({1}), Error);
  EXPECT_THROW(sum.set_exponents({1, kMaxExponent + 1}), Error);
}

}  // namespace
}  // namespace ddp
