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
#include "model_util.hpp"  // small_net, normal_values
#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/nn/model.hpp"
#include "ddp/nn/precision.hpp"

namespace ddp::nn {
namespace {

using test::CpuModel;
using test::run_cpu_kernel;
using test::small_net;

// n values from N(0, scale^2) (stream `stream`).
std::vector<float> random(size_t n, uint64_t stream, double scale = 1.0) { return test::normal_values(n, stream, scale); }

constexpr int kBatch = 4, kClasses = 10;

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

// Note [tf32]: a GPU's tensor-core format; values stay fp32, so nothing is
// rounded around the ops, and a CPU computes fp32 bit for bit.
TEST(MixedPrecision, Tf32IsFp32OnTheCpu) {
  EXPECT_EQ(parse_precision("tf32"), Precision::TF32);
  EXPECT_STREQ(to_string(Precision::TF32), "tf32");
  EXPECT_FALSE(is_half(Precision::TF32));
  EXPECT_FALSE(is_half(Precision::F32));
  EXPECT_TRUE(is_half(Precision::BF16) && is_half(Precision::F16));
  for (float v : {1.0f + 0x1p-20f, 3.14159274f, -2.5e-30f}) EXPECT_EQ(round_to(Precision::TF32, v), v);
  EXPECT_THROW(parse_precision("tf16"), ddp::Error);
  const Graph g = small_net();
  const std::vector<float> x = random(size_t(kBatch) * 50, 1), d = random(size_t(kBatch) * kClasses, 2, 0.1);
  std::vector<float> logits[2], grads[2];
  for (int t = 0; t < 2; ++t) {
    CpuModel m(g, 3);
    m->set_precision(t == 0 ? Precision::F32 : Precision::TF32);
    const float* l = m->forward(x.data(), kBatch);
    logits[t].assign(l, l + kBatch * kClasses);
    m->zero_grads();
    m->backward(d.data(), kBatch);
    grads[t].assign(m->grads(), m->grads() + g.num_params);
  }
  EXPECT_EQ(logits[1], logits[0]);
  EXPECT_EQ(grads[1], grads[0]);
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
