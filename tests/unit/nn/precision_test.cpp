// Note [mixed precision] (nn/precision.hpp): Model rounds what autocast
// rounds, where it rounds it: a conv -> relu -> pool -> linear net in bf16
// and fp16 against the same ops' fp32 kernels called one by one on rounded
// operands; fp16's overflow; micro-shards on lanes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "cpu_model.hpp"
#include "ddp/core/rng.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/nn/model.hpp"
#include "ddp/nn/precision.hpp"

namespace ddp::nn {
namespace {

using test::CpuModel;
using test::run_cpu_kernel;

constexpr int kBatch = 4, kClasses = 10;

Graph small_net() {
  GraphBuilder b("small", {2, 5, 5}, /*pytorch_init=*/true);
  // The pool divides by 25: a rounding skipped before it would show.
  const int c = b.relu("relu", b.conv("conv", b.input(), 3, 3, 1, 1));
  return b.finish(b.linear("fc", b.flatten("flat", b.global_avg_pool("gap", c)), kClasses));
}

std::vector<float> random(size_t n, uint64_t stream, double scale = 1.0) {
  Rng rng(17, stream);
  std::vector<float> v(n);
  for (float& x : v) x = float(scale * rng.normal());
  return v;
}

std::vector<float> rounded(Precision p, std::vector<float> v) {
  for (float& x : v) x = round_to(p, x);
  return v;
}

std::vector<float> slice(const std::vector<float>& v, const TensorInfo& t) {
  return {v.begin() + long(t.offset), v.begin() + long(t.offset + t.numel)};
}

TEST(MixedPrecision, ModelRoundsConvAndLinearOperandsAsAutocastDoes) {
  const Graph g = small_net();
  const std::vector<float> x = random(size_t(kBatch) * 50, 1), d = random(size_t(kBatch) * kClasses, 2, 0.1);
  for (Precision p : {Precision::BF16, Precision::F16}) {
    SCOPED_TRACE(to_string(p));
    CpuModel m(g, 3);
    m->set_precision(p);
    const float* logits = m->forward(x.data(), kBatch);
    const std::vector<float> got(logits, logits + kBatch * kClasses);
    m->zero_grads();
    m->backward(d.data(), kBatch);
    const std::vector<float> grads(m->grads(), m->grads() + g.num_params);

    // The reference: each op's fp32 kernel, its operands rounded by hand.
    const std::vector<float> params = init_state(g, 3).params;
    const auto& ps = g.params;  // flat order: fc.weight, fc.bias, conv.weight, conv.bias
    auto param = [&](const char* name) {
      for (const TensorInfo& t : ps)
        if (t.name == name) return t;
      ADD_FAILURE() << "no " << name;
      return ps[0];
    };
    const TensorInfo cw = param("conv.weight"), cb = param("conv.bias"), fw = param("fc.weight"),
                     fb = param("fc.bias");
    const std::vector<float> cw_r = rounded(p, slice(params, cw)), cb_r = rounded(p, slice(params, cb)),
                             fw_r = rounded(p, slice(params, fw)), fb_r = rounded(p, slice(params, fb));
    const std::vector<float> x_r = rounded(p, x);
    const std::vector<float> conv_y = rounded(p, run_cpu_kernel(g, 0, kBatch, {x_r}, {cw_r, cb_r}, {}).y);
    const std::vector<float> relu_y = run_cpu_kernel(g, 1, kBatch, {conv_y}, {}, {}).y;
    const std::vector<float> gap_y = run_cpu_kernel(g, 2, kBatch, {relu_y}, {}, {}).y;
    const std::vector<float> fc_in = rounded(p, gap_y);  // flatten moves nothing
    const test::KernelRun fc = run_cpu_kernel(g, 4, kBatch, {fc_in}, {fw_r, fb_r}, rounded(p, d));
    EXPECT_EQ(got, rounded(p, fc.y)) << "logits";
    const std::vector<float> gap_dx = run_cpu_kernel(g, 2, kBatch, {relu_y}, {}, rounded(p, fc.dx[0])).dx[0];
    const std::vector<float> relu_dx = run_cpu_kernel(g, 1, kBatch, {conv_y}, {}, gap_dx).dx[0];
    const test::KernelRun conv = run_cpu_kernel(g, 0, kBatch, {x_r}, {cw_r, cb_r}, rounded(p, relu_dx));
    EXPECT_EQ(slice(grads, fw), rounded(p, fc.dp[0])) << "fc.weight's gradient";
    EXPECT_EQ(slice(grads, fb), rounded(p, fc.dp[1])) << "fc.bias's gradient";
    EXPECT_EQ(slice(grads, cw), rounded(p, conv.dp[0])) << "conv.weight's gradient";
    EXPECT_EQ(slice(grads, cb), rounded(p, conv.dp[1])) << "conv.bias's gradient";
    const std::vector<float> conv32 = run_cpu_kernel(g, 0, kBatch, {x}, {slice(params, cw), slice(params, cb)}, {}).y;
    const std::vector<float> relu32 = run_cpu_kernel(g, 1, kBatch, {conv32}, {}, {}).y;
    const std::vector<float> gap32 = run_cpu_kernel(g, 2, kBatch, {relu32}, {}, {}).y;
    const std::vector<float> logits32 =
        run_cpu_kernel(g, 4, kBatch, {gap32}, {slice(params, fw), slice(params, fb)}, {}).y;
    EXPECT_NE(got, logits32) << "the logits should differ from fp32's";

    // A second micro-batch (--accumulate) adds its rounded gradients in fp32.
    m->forward(x.data(), kBatch);
    m->backward(d.data(), kBatch);
    for (size_t i = 0; i < g.num_params; ++i) ASSERT_EQ(m->grads()[i], 2 * grads[i]) << i;

    // Back to fp32: the fp32 kernels' own results.
    m->set_precision(Precision::F32);
    const float* again = m->forward(x.data(), kBatch);
    EXPECT_EQ(std::vector<float>(again, again + kBatch * kClasses), logits32);
  }
}

bool all_finite(const float* p, size_t n) {
  return std::all_of(p, p + n, [](float v) { return std::isfinite(v); });
}

// What the loss scaler is for: a d(loss) scaled past 65504 is an infinity
// in fp16, and the gradients say so; fp32 and bf16 hold it.
TEST(MixedPrecision, Fp16OverflowsWhereFp32AndBf16DoNot) {
  const Graph g = small_net();
  const std::vector<float> x = random(size_t(kBatch) * 50, 1), d = random(size_t(kBatch) * kClasses, 2, 1e6);
  for (Precision p : {Precision::F32, Precision::BF16, Precision::F16}) {
    CpuModel m(g, 3);
    m->set_precision(p);
    m->forward(x.data(), kBatch);
    m->zero_grads();
    m->backward(d.data(), kBatch);
    EXPECT_EQ(all_finite(m->grads(), g.num_params), p != Precision::F16) << to_string(p);
  }
}

// Note [lanes]: in micro-shards each shard's gradients are rounded on its
// lane; the same bits at one lane and at three, and the logits those of the
// whole batch (every rounding is per element).
TEST(MixedPrecision, MicroShardsOnLanesRoundTheirOwnGradients) {
  struct Collect final : ShardGradients {
    explicit Collect(const Graph& graph) : g(graph) {}
    const Graph& g;
    std::mutex mu;
    std::vector<std::vector<float>> got;  // every shard's gradients of every op
    void take(int, const float* grad, size_t first, size_t count) override {
      size_t n = 0;
      for (size_t k = first; k < first + count; ++k) n += g.params[k].numel;
      std::lock_guard<std::mutex> lock(mu);
      got.emplace_back(grad, grad + n);
    }
    void taken(size_t, size_t) override {}
  };
  const Graph g = small_net();
  const int batch = 8, shard = 2;
  const std::vector<float> x = random(size_t(batch) * 50, 4), d = random(size_t(batch) * kClasses, 5, 0.1);
  CpuModel whole(g, 3);
  whole->set_precision(Precision::BF16);
  const float* lw = whole->forward(x.data(), batch);
  const std::vector<float> whole_logits(lw, lw + batch * kClasses);
  std::vector<std::vector<float>> by_lanes[2];
  for (int t = 0; t < 2; ++t) {
    CpuModel m(g, 3, t == 0 ? 1 : 3);
    m->set_precision(Precision::BF16);
    const float* l = m->forward(x.data(), batch, Mode::Train, shard);
    EXPECT_EQ(std::vector<float>(l, l + batch * kClasses), whole_logits);
    Collect c(g);
    m->zero_grads();
    m->backward_shards(d.data(), batch, c);
    std::sort(c.got.begin(), c.got.end());
    by_lanes[t] = c.got;
  }
  ASSERT_EQ(by_lanes[0].size(), size_t(2 * batch / shard));  // two ops with parameters, four shards each
  EXPECT_EQ(by_lanes[0], by_lanes[1]);
  // Each shard's gradients are on bf16's grid, and not all zero.
  for (const auto& v : by_lanes[0]) {
    EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](float f) { return f != 0.0f; }));
    for (float f : v) ASSERT_EQ(f, round_to(Precision::BF16, f));
  }
}

// Note [half kernels]: what the GPU's 16-bit kernels convert with. Every
// 16-bit value goes to float and back unchanged, in each format, and a
// float's 16-bit copy read back is round_to's value; a convolution's output
// takes its own channel's bias, rounded, and the sum is rounded again.
TEST(MixedPrecision, HalfKernelsConvertAsRoundTo) {
  for (Precision p : {Precision::BF16, Precision::F16}) {
    SCOPED_TRACE(to_string(p));
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const float f = half_bits_to_float(p, uint16_t(h));
      if (std::isnan(f)) continue;
      ASSERT_EQ(to_half_bits(p, f), h) << "bits " << h;
    }
    for (float x : random(1000, 6, 300.0)) ASSERT_EQ(half_bits_to_float(p, to_half_bits(p, x)), round_to(p, x));
    // Two images of three channels of two pixels, each conv output 1 + 2^-13
    // (not a bf16 or fp16 value: its 16-bit copy is 1), biases that tell the
    // channels apart.
    const int images = 2, channels = 3, pixels = 2;
    const std::vector<float> b = {0.5f, -0.25f, 3.0f + 0x1p-12f};
    std::vector<uint16_t> yh(size_t(images * channels * pixels), to_half_bits(p, 1.0f + 0x1p-13f));
    for (int64_t i = 0; i < images * channels * pixels; ++i) {
      const int c = int(i / pixels % channels);
      EXPECT_EQ(plane_from_half_at(i, channels, pixels, p, yh.data(), b.data()), round_to(p, 1.0f + round_to(p, b[c])))
          << i;
      EXPECT_EQ(plane_from_half_at(i, channels, pixels, p, yh.data(), nullptr), 1.0f) << i;
    }
  }
}

}  // namespace
}  // namespace ddp::nn
