// Model (the executor) on the CPU device: flat layout, ready-prefix callbacks,
// init, accumulation, gradients through a residual fan-out, training, eval
// mode, the fused LeNet against the unfused one, and model_graph's checks.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "cpu_model.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"
#include "ddp/core/fixed_point.hpp"  // Sink, quantize_add
#include "ddp/nn/cpu/ops.hpp"  // winograd_applies, winograd_applies_to_shards
#include "ddp/nn/graph.hpp"
#include "ddp/nn/model.hpp"
#include "ddp/nn/cpu/packed_gemm.hpp"  // kFixedPointGemm
#include "ddp/nn/cpu/thread_pool.hpp"
#include "grad_check.hpp"

namespace ddp::nn {
namespace {

using test::CpuModel;
using test::cpu_model;

constexpr size_t kLenetParams = (20 * 9 + 20) + (50 * 20 * 25 + 50) + (800 * 128 + 128) + (128 * 10 + 10);

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch random_batch(int n, uint64_t seed, int numel = 784, int classes = 10) {
  Rng rng(seed, 3);
  Batch b;
  b.x.resize(size_t(n) * numel);
  for (float& v : b.x) v = rng.uniform();
  for (int i = 0; i < n; ++i) b.y.push_back(int32_t(rng.below(uint64_t(classes))));
  return b;
}

// Learnable: class c is a bright 10x5 block at its own place, over faint noise.
Batch block_batch(int n, uint64_t seed) {
  Rng rng(seed, 4);
  Batch b;
  for (int i = 0; i < n; ++i) {
    const int32_t label = int32_t(i % 10);
    const int top = (label / 5) * 14, left = (label % 5) * 5;
    b.y.push_back(label);
    for (int r = 0; r < 28; ++r)
      for (int c = 0; c < 28; ++c) {
        const bool on = r >= top && r < top + 10 && c >= left && c < left + 5;
        b.x.push_back(0.1f * rng.uniform() + (on ? 1.0f : 0.0f));
      }
  }
  return b;
}

// One forward + loss + backward; returns the loss.
float step(Model& m, const Batch& b, const std::function<void(size_t)>& on_ready = {}) {
  const int n = int(b.y.size());
  const int classes = int(m.output_shape().numel());
  const float* logits = m.forward(b.x.data(), n);
  std::vector<float> d(size_t(n) * classes);
  const float loss = softmax_cross_entropy(logits, b.y.data(), n, classes, d.data());
  m.backward(d.data(), n, on_ready);
  return loss;
}

float loss_of(Model& m, const Batch& b, Mode mode = Mode::Train) {
  const int n = int(b.y.size());
  return softmax_cross_entropy(m.forward(b.x.data(), n, mode), b.y.data(), n, int(m.output_shape().numel()),
                               nullptr);
}

// A small network with everything ResNet-18 has: a stem with BatchNorm, one
// residual block whose shortcut is a strided 1x1 projection, one whose
// shortcut is its input (read by two ops: the fan-out), global pooling, fc.
// relu: ResNet's ReLUs; without them the network is smooth, and finite
// differences of its loss are exact enough to check gradients against.
Graph tiny_resnet(int classes = 5, bool relu = true) {
  GraphBuilder b("tiny", {2, 8, 8}, /*pytorch_init=*/true);
  auto act = [&](const std::string& name, int v) { return relu ? b.relu(name, v) : v; };
  int x = act("stem.relu", b.batch_norm("stem.bn", b.conv("stem.conv", b.input(), 4, 3, 1, 1)));
  for (int blk = 0; blk < 2; ++blk) {
    const std::string p = "block" + std::to_string(blk);
    const int c = 6, stride = blk == 0 ? 2 : 1;
    int y = act(p + ".relu1", b.batch_norm(p + ".bn1", b.conv(p + ".conv1", x, c, 3, stride, 1)));
    y = b.batch_norm(p + ".bn2", b.conv(p + ".conv2", y, c, 3, 1, 1));
    const int s = blk == 0 ? b.conv(p + ".conv3", x, c, 1, stride, 0) : x;
    x = b.add(p + ".add", y, s, relu);
  }
  x = b.flatten("flat", b.global_avg_pool("gap", x));
  return b.finish(b.linear("fc", x, classes));
}

TEST(Model, LenetShapeAndParameterCount) {
  const Graph g = model_graph("lenet", {1, 28, 28}, 10);
  EXPECT_EQ(g.num_params, kLenetParams);
  EXPECT_EQ(g.output_shape(), (Shape{10, 1, 1}));
  EXPECT_EQ(g.input, (Shape{1, 28, 28}));
  EXPECT_EQ(g.model, "lenet");
  EXPECT_EQ(g.num_buffers, 0u);
  EXPECT_EQ(model_graph("mlp", {1, 28, 28}, 10).num_params, size_t(784 * 256 + 256 + 256 * 10 + 10));
}

// Note [flat layout]: last op first, weight before bias, no gaps.
TEST(Model, FlatLayoutIsBackwardOrder) {
  const Graph g = model_graph("lenet", {1, 28, 28}, 10);
  const auto& info = g.params;
  const std::vector<std::string> names = {"fc2.weight", "fc2.bias",   "fc1.weight", "fc1.bias",
                                          "conv2.weight", "conv2.bias", "conv1.weight",
                                          "conv1.bias"};
  ASSERT_EQ(info.size(), names.size());
  size_t offset = 0;
  for (size_t i = 0; i < info.size(); ++i) {
    EXPECT_EQ(info[i].name, names[i]);
    EXPECT_EQ(info[i].offset, offset) << info[i].name;
    const size_t n = size_t(std::accumulate(info[i].shape.begin(), info[i].shape.end(), int64_t(1),
                                            std::multiplies<int64_t>()));
    EXPECT_EQ(info[i].numel, n) << info[i].name;
    offset += n;
  }
  EXPECT_EQ(offset, g.num_params);
  EXPECT_EQ(info[0].shape, (std::vector<int64_t>{10, 128}));
  EXPECT_EQ(info[6].shape, (std::vector<int64_t>{20, 1, 3, 3}));
}

// The reducer's contract: prefixes never shrink, end at num_params, and each
// reported prefix is final (a later op's backward leaves it unchanged), also
// across a residual block's fan-out.
TEST(Model, OnReadyPrefixesGrowAndAreFinal) {
  for (const bool resnet : {false, true}) {
    CpuModel m = resnet ? CpuModel(tiny_resnet(), 1) : cpu_model("lenet", 1);
    const Batch b = resnet ? random_batch(6, 2, 128, 5) : random_batch(8, 2);
    m->zero_grads();
    std::vector<size_t> prefixes;
    std::vector<std::vector<float>> snapshots;
    step(*m, b, [&](size_t n) {
      prefixes.push_back(n);
      snapshots.emplace_back(m->grads(), m->grads() + n);
    });
    ASSERT_FALSE(prefixes.empty());
    for (size_t i = 1; i < prefixes.size(); ++i) EXPECT_GE(prefixes[i], prefixes[i - 1]);
    EXPECT_EQ(prefixes.back(), m->num_params());
    EXPECT_GT(prefixes.front(), 0u) << "the last op's gradients are ready after its backward";
    EXPECT_LT(prefixes.front(), m->num_params());
    for (size_t i = 0; i < prefixes.size(); ++i)
      for (size_t j = 0; j < prefixes[i]; ++j)
        ASSERT_EQ(snapshots[i][j], m->grads()[j]) << "prefix " << prefixes[i] << " changed at " << j;
  }
}

TEST(Model, BackwardTwiceAccumulatesDoubleGradients) {
  CpuModel m = cpu_model("lenet", 3);
  const Batch b = random_batch(16, 4);
  m->zero_grads();
  step(*m, b);
  const std::vector<float> once(m->grads(), m->grads() + m->num_params());
  step(*m, b);
  double nonzero = 0;
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_NEAR(m->grads()[i], 2 * once[i], 1e-6f + 1e-5f * std::abs(once[i])) << i;
    nonzero += once[i] != 0.0f;
  }
  // Inactive fc1 units (relu) zero their rows of fc1.weight: about half of it.
  EXPECT_GT(nonzero, 0.3 * double(once.size()));
  m->zero_grads();
  for (size_t i = 0; i < m->num_params(); ++i) ASSERT_EQ(m->grads()[i], 0.0f);
}

// The gradient the executor assembles (every op's backward, the fan-out of a
// residual input added up, BatchNorm in training mode) is the derivative of
// the loss: along random directions, against central differences of the
// loss itself. (Without ReLUs, whose kinks would need a step too small for
// float; the wiring with them is checked exactly below.)
TEST(Model, GradientsAreTheLossDerivativeThroughResidualBlocks) {
  CpuModel m(tiny_resnet(5, /*relu=*/false), 21);
  const Batch b = random_batch(6, 22, 128, 5);
  m->zero_grads();
  step(*m, b);
  const std::vector<float> g(m->grads(), m->grads() + m->num_params());
  const std::vector<float> p0(m->params(), m->params() + m->num_params());
  for (uint64_t dir = 0; dir < 4; ++dir) {
    const std::vector<double> v = test::random_vec(p0.size(), 100 + dir);
    double gv = 0;
    for (size_t i = 0; i < v.size(); ++i) gv += double(g[i]) * v[i];
    const double h = 1e-3;
    auto loss_at = [&](double t) {
      for (size_t i = 0; i < v.size(); ++i) m->params()[i] = float(p0[i] + t * v[i]);
      return double(loss_of(*m, b));
    };
    const double numeric = (loss_at(h) - loss_at(-h)) / (2 * h);
    EXPECT_NEAR(gv, numeric, 2e-2 * std::abs(numeric) + 2e-3) << "direction " << dir;
  }
}

// A value read by two ops (a residual input: by a convolution and by the add
// with its ReLU) gets both gradients: the executor's gradients equal the
// chain rule worked by hand with the double kernels.
TEST(Model, AValueReadTwiceGetsBothGradients) {
  GraphBuilder gb("fanout", {2, 6, 6}, true);
  const int x = gb.conv("c", gb.input(), 3, 3, 1, 1);
  const int y = gb.conv("c2", x, 3, 3, 1, 1);
  const int s = gb.flatten("f", gb.add("add", y, x, /*relu=*/true));
  CpuModel m(gb.finish(gb.linear("fc", s, 4)), 7);
  const Batch b = random_batch(5, 8, 72, 4);
  m->zero_grads();
  step(*m, b);
  // The same by hand, in double.
  const Graph& g = m->graph();
  auto param = [&](const std::string& name) {
    for (const auto& t : g.params)
      if (t.name == name) return std::vector<double>(m->params() + t.offset, m->params() + t.offset + t.numel);
    return std::vector<double>();
  };
  const int n = 5;
  const std::vector<double> in(b.x.begin(), b.x.end());
  const auto wc = param("c.weight"), bc = param("c.bias"), w2 = param("c2.weight"), b2 = param("c2.bias"),
             wf = param("fc.weight"), bf = param("fc.bias");
  const cpu::ConvGeom g1 = test::conv_geom(n, 2, 6, 6, 3, 3, 1, 1), g2 = test::conv_geom(n, 3, 6, 6, 3, 3, 1, 1);
  cpu::ConvScratch<double> ws;
  std::vector<double> xv(size_t(n) * 108), yv(xv.size()), sv(xv.size()), logits(size_t(n) * 4), dl(logits.size());
  cpu::conv2d_forward(g1, in.data(), wc.data(), bc.data(), xv.data(), ws);
  cpu::conv2d_forward(g2, xv.data(), w2.data(), b2.data(), yv.data(), ws);
  cpu::add_forward(int64_t(xv.size()), yv.data(), xv.data(), true, sv.data());
  cpu::linear_forward(n, 108, 4, sv.data(), wf.data(), bf.data(), logits.data());
  cpu::softmax_cross_entropy(logits.data(), b.y.data(), n, 4, dl.data());
  std::vector<double> dwf(wf.size(), 0), dbf(4, 0), ds(sv.size()), dy(sv.size()), dx(sv.size()), dx2(sv.size()),
      dw2(w2.size(), 0), db2(3, 0), dwc(wc.size(), 0), dbc(3, 0);
  cpu::linear_backward(n, 108, 4, sv.data(), wf.data(), dl.data(), dwf.data(), dbf.data(), ds.data());
  cpu::add_backward(int64_t(sv.size()), sv.data(), true, ds.data(), dy.data(), dx.data());
  cpu::conv2d_backward(g2, xv.data(), w2.data(), dy.data(), dw2.data(), db2.data(), dx2.data(), ws);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] += dx2[i];  // the fan-out
  cpu::conv2d_backward(g1, in.data(), wc.data(), dx.data(), dwc.data(), dbc.data(), static_cast<double*>(nullptr), ws);
  auto grad = [&](const std::string& name) {
    for (const auto& t : g.params)
      if (t.name == name) return std::vector<float>(m->grads() + t.offset, m->grads() + t.offset + t.numel);
    return std::vector<float>();
  };
  EXPECT_LT(test::scaled_err(grad("fc.weight"), dwf), 1e-5);
  EXPECT_LT(test::scaled_err(grad("c2.weight"), dw2), 1e-5);
  EXPECT_LT(test::scaled_err(grad("c2.bias"), db2), 1e-5);
  EXPECT_LT(test::scaled_err(grad("c.weight"), dwc), 1e-5);
  EXPECT_LT(test::scaled_err(grad("c.bias"), dbc), 1e-5);
}

TEST(Model, InitIsNormal001WeightsZeroBiasesAndSeeded) {
  const Graph g = model_graph("lenet", {1, 28, 28}, 10);
  const ModelState s = init_state(g, 7);
  for (const auto& p : g.params) {
    const float* v = s.params.data() + p.offset;
    if (p.name.find("bias") != std::string::npos) {
      for (size_t i = 0; i < p.numel; ++i) ASSERT_EQ(v[i], 0.0f) << p.name;
      continue;
    }
    double sum = 0, sq = 0;
    for (size_t i = 0; i < p.numel; ++i) {
      sum += v[i];
      sq += double(v[i]) * v[i];
    }
    const double mean = sum / double(p.numel), sd = std::sqrt(sq / double(p.numel) - mean * mean);
    const double se = 0.01 / std::sqrt(double(p.numel));  // standard error of the mean
    EXPECT_LT(std::abs(mean), 5 * se) << p.name;
    EXPECT_NEAR(sd, 0.01, 0.01 * 5 / std::sqrt(2.0 * double(p.numel))) << p.name;
  }
  EXPECT_EQ(init_state(g, 7).params, s.params);
  const ModelState other = init_state(g, 8);
  size_t equal = 0;
  for (size_t i = 0; i < g.num_params; ++i) equal += s.params[i] == other.params[i];
  EXPECT_LT(equal, g.num_params / 10 + 1000) << "seed 8 should differ from seed 7 (biases are equal)";
}

// PyTorch's defaults: Conv2d and Linear weights and biases U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)); BatchNorm weight 1, bias 0, running mean 0, variance 1.
TEST(Model, Resnet18InitIsPytorchsDefault) {
  const Graph g = model_graph("resnet18", {1, 28, 28}, 10);
  const ModelState s = init_state(g, 3);
  for (const auto& p : g.params) {
    const float* v = s.params.data() + p.offset;
    if (p.name.find(".bn") != std::string::npos || p.name.rfind("1.", 0) == 0) {
      for (size_t i = 0; i < p.numel; ++i) ASSERT_EQ(v[i], p.name.find("weight") != std::string::npos ? 1.f : 0.f);
      continue;
    }
    const int64_t fan_in = p.shape.size() == 1 ? 0 : p.numel / p.shape[0];
    ASSERT_EQ(p.init, Init::Uniform) << p.name;
    if (fan_in) {
      EXPECT_DOUBLE_EQ(p.bound, 1.0 / std::sqrt(double(fan_in))) << p.name;
    }
    double sq = 0;
    for (size_t i = 0; i < p.numel; ++i) {
      ASSERT_LE(std::abs(v[i]), p.bound) << p.name;
      sq += double(v[i]) * v[i];
    }
    if (p.numel > 1000) {  // variance of U(-b, b) is b^2/3
      EXPECT_NEAR(sq / double(p.numel), p.bound * p.bound / 3, 0.05 * p.bound * p.bound) << p.name;
    }
  }
  for (const auto& b : g.buffers) {
    const float* v = s.buffers.data() + b.offset;
    for (size_t i = 0; i < b.numel; ++i) ASSERT_EQ(v[i], b.name.find("running_var") != std::string::npos ? 1.f : 0.f);
  }
  EXPECT_EQ(s.counters, std::vector<int64_t>(g.counters.size(), 0));
}

// d2l's resnet18 under the state-dict names of its PyTorch definition.
TEST(Model, Resnet18HasThePytorchModelsTensors) {
  const Graph g = model_graph("resnet18", {1, 28, 28}, 10);
  EXPECT_EQ(g.num_params, size_t(11175818));
  EXPECT_EQ(g.output_shape(), (Shape{10, 1, 1}));
  auto has = [](const std::vector<TensorInfo>& ts, const std::string& name, std::vector<int64_t> shape) {
    for (const auto& t : ts)
      if (t.name == name) return t.shape == shape;
    return false;
  };
  EXPECT_TRUE(has(g.params, "0.weight", {64, 1, 3, 3}));
  EXPECT_TRUE(has(g.params, "0.bias", {64}));
  EXPECT_TRUE(has(g.params, "1.weight", {64}));
  EXPECT_TRUE(has(g.buffers, "1.running_mean", {64}));
  EXPECT_TRUE(has(g.params, "resnet_block1.1.conv2.weight", {64, 64, 3, 3}));
  EXPECT_TRUE(has(g.params, "resnet_block2.0.conv1.weight", {128, 64, 3, 3}));
  EXPECT_TRUE(has(g.params, "resnet_block2.0.conv3.weight", {128, 64, 1, 1}));
  EXPECT_TRUE(has(g.buffers, "resnet_block4.1.bn2.running_var", {512}));
  EXPECT_TRUE(has(g.params, "fc.1.weight", {10, 512}));
  EXPECT_TRUE(has(g.params, "fc.1.bias", {10}));
  EXPECT_FALSE(has(g.params, "resnet_block1.0.conv3.weight", {64, 64, 1, 1})) << "the first block keeps its shape";
  EXPECT_EQ(g.counters.size(), 17u);  // the stem's BatchNorm and two per Residual
  EXPECT_EQ(g.counters.front(), "1.num_batches_tracked");
  EXPECT_EQ(g.num_buffers, 2 * (64 + 4 * 64 + 4 * 128 + 4 * 256 + 4 * 512u));
  // The last stage runs at 4x4, as PyTorch's for a 28x28 input.
  EXPECT_EQ(g.values[g.values.size() - 4], (Shape{512, 4, 4}));
}

TEST(Model, SgdStepsReduceTheLoss) {
  for (const char* name : {"lenet", "mlp"}) {
    CpuModel m = cpu_model(name, 11);
    // N(0, 0.1) rather than the recipe's N(0, 0.01): from that tiny init LeNet's
    // logits and gradients start ~1e-4 and it sits on a plateau for hundreds
    // of steps (as in d2l), which would make this test slow, not stronger.
    for (size_t i = 0; i < m->num_params(); ++i) m->params()[i] *= 10.0f;
    const Batch b = block_batch(40, 12);
    float first = 0, last = 0;
    for (int it = 0; it < 30; ++it) {
      m->zero_grads();
      last = step(*m, b);
      if (it == 0) first = last;
      for (size_t i = 0; i < m->num_params(); ++i) m->params()[i] -= 0.1f * m->grads()[i];
    }
    EXPECT_GT(first, 1.5f) << name;
    EXPECT_LT(last, 0.2f * first) << name;
  }
}

// Training mode normalises with the batch's statistics and moves the running
// ones; eval mode normalises with the running ones and moves nothing.
TEST(Model, EvalModeUsesTheRunningStatistics) {
  GraphBuilder gb("bn", {3, 4, 4}, true);
  const int x = gb.batch_norm("bn", gb.input());
  CpuModel m(gb.finish(gb.flatten("flat", x)));
  const Batch b = random_batch(5, 31, 48, 48);
  m->forward(b.x.data(), 5, Mode::Train);
  EXPECT_EQ(m->counters()[0], 1);
  const std::vector<float> rm(m->buffers(), m->buffers() + 3), rv(m->buffers() + 3, m->buffers() + 6);
  for (int c = 0; c < 3; ++c) {
    double sum = 0;
    for (int n = 0; n < 5; ++n)
      for (int i = 0; i < 16; ++i) sum += b.x[size_t((n * 3 + c) * 16 + i)];
    EXPECT_NEAR(rm[c], 0.1 * sum / 80, 1e-6) << "running mean moved by momentum 0.1 from 0";
    EXPECT_GT(rv[c], 0.9f) << "running variance moved from 1 towards the batch's";
  }
  const float* y = m->forward(b.x.data(), 5, Mode::Eval);
  for (int n = 0; n < 5; ++n)
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 16; ++i) {
        const size_t k = size_t((n * 3 + c) * 16 + i);
        EXPECT_NEAR(y[k], (b.x[k] - rm[c]) / std::sqrt(rv[c] + 1e-5), 1e-5) << k;
      }
  EXPECT_EQ(m->counters()[0], 1) << "eval counts no batch";
  EXPECT_EQ(std::vector<float>(m->buffers(), m->buffers() + 3), rm) << "eval moves no statistic";
}

TEST(Model, ResultsDoNotDependOnThreads) {
  for (const bool resnet : {false, true}) {
    CpuModel one = resnet ? CpuModel(tiny_resnet(), 5, 1) : cpu_model("lenet", 5, 1);
    CpuModel two = resnet ? CpuModel(tiny_resnet(), 5, 2) : cpu_model("lenet", 5, 2);
    const Batch b = resnet ? random_batch(37, 6, 128, 5) : random_batch(37, 6);
    one->zero_grads();
    two->zero_grads();
    const float l1 = step(*one, b), l2 = step(*two, b);
    EXPECT_NEAR(l1, l2, 1e-6f);
    const std::vector<double> g1(one->grads(), one->grads() + one->num_params());
    const std::vector<float> g2(two->grads(), two->grads() + two->num_params());
    EXPECT_LT(test::scaled_err(g2, g1), 1e-5);
  }
}

// The kernels make OpenBLAS single-threaded only while they run (Note
// [serial OpenBLAS]): the count World set is back after a step.
TEST(Model, StepLeavesOpenBlasThreadsAlone) {
  const int before = openblas_get_num_threads();
  openblas_set_num_threads(2);
  EXPECT_EQ(default_threads(), 2);
  CpuModel m = cpu_model("lenet", 3, default_threads());
  step(*m, random_batch(20, 12));
  EXPECT_EQ(openblas_get_num_threads(), 2);
  openblas_set_num_threads(before);
}

// model_graph's LeNet fuses conv -> relu -> pool; the same model built from
// separate ops must compute the same thing.
TEST(Model, FusedLenetMatchesUnfusedOps) {
  GraphBuilder gb("lenet-unfused", {1, 28, 28}, false);
  int x = gb.avg_pool2("pool1", gb.relu("relu1", gb.conv("conv1", gb.input(), 20, 3)));
  x = gb.avg_pool2("pool2", gb.relu("relu2", gb.conv("conv2", x, 50, 5)));
  x = gb.relu("relu3", gb.linear("fc1", gb.flatten("flatten", x), 128));
  CpuModel unfused(gb.finish(gb.linear("fc2", x, 10)), 9);
  CpuModel fused = cpu_model("lenet", 9);
  ASSERT_EQ(unfused->num_params(), fused->num_params());
  // Larger weights than the N(0, 0.01) init so every op's signal matters.
  for (size_t i = 0; i < fused->num_params(); ++i) fused->params()[i] = unfused->params()[i] *= 10;

  const Batch b = random_batch(9, 10);
  fused->zero_grads();
  unfused->zero_grads();
  const float* pf = fused->forward(b.x.data(), 9);
  const std::vector<float> lf(pf, pf + 90);
  const float* pu = unfused->forward(b.x.data(), 9);
  const std::vector<double> lud(pu, pu + 90);
  EXPECT_LT(test::scaled_err(lf, lud), 1e-5);
  step(*fused, b);
  step(*unfused, b);
  const std::vector<double> gu(unfused->grads(), unfused->grads() + unfused->num_params());
  const std::vector<float> gf(fused->grads(), fused->grads() + fused->num_params());
  EXPECT_LT(test::scaled_err(gf, gu), 1e-5);
}

// What backward_shards hands over: each param's micro-shard gradients as
// they came (to compare bit for bit), their sum, and the calls.
struct Taken final : ShardGradients {
  Taken(const Graph& g, int lanes) : g(g), shards(g.params.size()), sum(g.num_params, 0.0),
                                     folds(g.params.size(), 0), lane_calls(size_t(lanes), 0) {}
  void take(int lane, const float* p, size_t first, size_t count) override {
    std::lock_guard<std::mutex> lock(mu);
    ++lane_calls.at(size_t(lane));
    const size_t base = g.params[first].offset;
    for (size_t q = first; q < first + count; ++q) {
      const TensorInfo& t = g.params[q];
      EXPECT_EQ(folds[q], 0) << t.name << " taken after its op was done";
      shards[q].emplace_back(p + (t.offset - base), p + (t.offset - base) + t.numel);
      for (size_t i = 0; i < t.numel; ++i) sum[t.offset + i] += p[t.offset - base + i];
    }
  }
  void taken(size_t first, size_t count) override {
    for (size_t q = first; q < first + count; ++q) ++folds[q];
  }
  const Graph& g;
  std::mutex mu;
  std::vector<std::vector<std::vector<float>>> shards;  // per param, in the order taken
  std::vector<double> sum;
  std::vector<int> folds, lane_calls;
};

// The reference the micro-shard tests compare with: a model of g run on the
// whole batch (its parameters times `scale`), its evaluation logits over
// the first `eval_batch` samples, and a training step's logits, loss
// gradient d, parameter gradients, counters and buffers.
struct WholeBatch {
  WholeBatch(Graph g, const Batch& b, int batch, int eval_batch, int classes, float scale = 1.0f)
      : d(size_t(batch) * size_t(classes)) {
    CpuModel whole(std::move(g), 8);
    for (size_t i = 0; i < whole->num_params(); ++i) whole->params()[i] *= scale;
    whole->get_state(start);
    const float* le = whole->forward(b.x.data(), eval_batch, Mode::Eval);
    eval.assign(le, le + size_t(eval_batch) * size_t(classes));
    whole->zero_grads();
    const float* lw = whole->forward(b.x.data(), batch);
    logits.assign(lw, lw + d.size());
    softmax_cross_entropy(lw, b.y.data(), batch, classes, d.data());
    whole->backward(d.data(), batch);
    grads.assign(whole->grads(), whole->grads() + whole->num_params());
    counters = whole->counters();
    buffers.assign(whole->buffers(), whole->buffers() + whole->graph().num_buffers);
  }
  ModelState start;
  std::vector<double> eval, logits, buffers;  // buffers: after the step
  std::vector<float> d, grads;
  std::vector<int64_t> counters;
};

// Note [micro-shards], Note [lanes] (device.hpp): a batch run op by op in
// micro-shards, on one lane or several, is the same computation as the whole
// batch (BatchNorm over all of it), and each micro-shard's logits and
// gradients are the same bits whichever lane ran it and however many there
// are (LeNet's fused conv-relu-pool keeps its ReLU mask per image for that;
// the tiny ResNet's convolutions, on AVX-512, multiply weights packed once
// for all the micro-shards: Note [packed weights]).
TEST(Model, MicroShardsOnLanesComputeWhatTheWholeBatchDoes) {
  constexpr int kBatch = 12, kShard = 3, kShards = kBatch / kShard, kEval = 11;
  for (const bool resnet : {true, false}) {
    const int classes = resnet ? 5 : 10;
    const auto graph = [&] { return resnet ? tiny_resnet() : model_graph("lenet", {1, 28, 28}, 10); };
    const Batch b = resnet ? random_batch(kBatch, 9, 128, classes) : random_batch(kBatch, 9);
    // Weights larger than LeNet's N(0, 0.01), so that every op's signal shows.
    const WholeBatch w(graph(), b, kBatch, kEval, classes, resnet ? 1.0f : 10.0f);
    const ModelState& start = w.start;
    const std::vector<double>& eval = w.eval;
    const std::vector<double>& logits = w.logits;
    const std::vector<float>& d = w.d;
    const std::vector<float>& gw = w.grads;

    std::vector<float> first_logits, first_eval;
    std::vector<std::vector<std::vector<float>>> first_shards;
    for (const int lanes : {1, 2, 3}) {
      SCOPED_TRACE(std::string(resnet ? "tiny resnet, " : "lenet, ") + std::to_string(lanes) + " lanes");
      CpuModel sharded(graph(), 8, lanes);
      ASSERT_EQ(sharded.device->lanes(), lanes);
      sharded->set_state(start);
      const Graph& g = sharded->graph();
      const float* lse = sharded->forward(b.x.data(), kEval, Mode::Eval, kShard);  // the last shard has 2
      const std::vector<float> ev(lse, lse + eval.size());
      EXPECT_LT(test::scaled_err(ev, eval), 1e-6);
      EXPECT_THROW(sharded->forward(b.x.data(), kEval, Mode::Train, kShard), Error) << "3 does not divide 11";
      sharded->zero_grads();
      const float* ls = sharded->forward(b.x.data(), kBatch, Mode::Train, kShard);
      const std::vector<float> lg(ls, ls + d.size());
      EXPECT_LT(test::scaled_err(lg, logits), 1e-6);
      Taken taken(g, lanes);
      sharded->backward_shards(d.data(), kBatch, taken);
      for (size_t p = 0; p < g.params.size(); ++p) {
        EXPECT_EQ(taken.shards[p].size(), size_t(kShards)) << g.params[p].name;
        EXPECT_EQ(taken.folds[p], 1) << g.params[p].name;
        std::sort(taken.shards[p].begin(), taken.shards[p].end());
      }
      EXPECT_EQ(*std::max_element(sharded->grads(), sharded->grads() + g.num_params), 0.0f);
      EXPECT_EQ(*std::min_element(sharded->grads(), sharded->grads() + g.num_params), 0.0f);
      EXPECT_LT(test::scaled_err(gw, taken.sum), 1e-5);
      if (lanes == 1) {
        first_logits = lg;
        first_eval = ev;
        first_shards = taken.shards;
      } else {
        EXPECT_EQ(lg, first_logits) << "training logits are not one lane's bits";
        EXPECT_EQ(ev, first_eval) << "evaluation logits are not one lane's bits";
        for (size_t p = 0; p < g.params.size(); ++p)
          EXPECT_EQ(taken.shards[p], first_shards[p]) << g.params[p].name << ": not one lane's bits";
      }
      // BatchNorm's running statistics moved once, by the whole batch's.
      EXPECT_EQ(sharded->counters(), w.counters);
      if (g.num_buffers == 0) continue;
      const std::vector<float> bs(sharded->buffers(), sharded->buffers() + g.num_buffers);
      EXPECT_LT(test::scaled_err(bs, w.buffers), 1e-6);
    }
  }
}

// A convolution whose micro-shards take Winograd's path only because they
// share one transform of the kernels (Kernel::begin_shards): 16 channels on
// 4x4 images, micro-shards of 8 (32 2x2 blocks: winograd_applies_to_shards,
// not winograd_applies), their weight gradients by im2col's path
// (shard_weight_grad_by_im2col). Each micro-shard's logits and gradients are
// one lane's bits at one lane or two (on AVX-512, one call of three
// micro-shards against calls of one and two: Note [shard runs]), and they
// add up to the whole batch's; the evaluation's last, smaller micro-shard (6
// images) takes im2col's path.
TEST(Model, MicroShardsSharingWinogradKernelsAreOneLanesBits) {
  constexpr int kBatch = 24, kShard = 8, kEval = 22, kClasses = 5;
  const auto graph = [] {
    GraphBuilder b("wide", {16, 4, 4}, /*pytorch_init=*/true);
    const int y = b.relu("relu", b.conv("conv", b.input(), 16, 3, 1, 1));
    return b.finish(b.linear("fc", b.flatten("flat", b.global_avg_pool("gap", y)), kClasses));
  };
  const cpu::ConvGeom g = test::conv_geom(kShard, 16, 4, 4, 16, 3, 1, 1);
  ASSERT_TRUE(cpu::winograd_applies_to_shards(g));
  ASSERT_FALSE(cpu::winograd_applies(g));
  ASSERT_TRUE(cpu::shard_weight_grad_by_im2col(g));
  const Batch b = random_batch(kBatch, 21, 256, kClasses);
  const WholeBatch w(graph(), b, kBatch, kEval, kClasses);

  std::vector<float> first_logits, first_eval;
  std::vector<std::vector<std::vector<float>>> first_shards;
  for (const int lanes : {1, 2}) {
    SCOPED_TRACE(std::to_string(lanes) + " lanes");
    CpuModel sharded(graph(), 8, lanes);
    sharded->set_state(w.start);
    const float* lse = sharded->forward(b.x.data(), kEval, Mode::Eval, kShard);
    const std::vector<float> ev(lse, lse + w.eval.size());
    EXPECT_LT(test::scaled_err(ev, w.eval), 1e-5);
    sharded->zero_grads();
    const float* ls = sharded->forward(b.x.data(), kBatch, Mode::Train, kShard);
    const std::vector<float> lg(ls, ls + w.d.size());
    EXPECT_LT(test::scaled_err(lg, w.logits), 1e-5);
    Taken taken(sharded->graph(), lanes);
    sharded->backward_shards(w.d.data(), kBatch, taken);
    EXPECT_LT(test::scaled_err(w.grads, taken.sum), 1e-5);
    for (auto& s : taken.shards) std::sort(s.begin(), s.end());
    if (lanes == 1) {
      first_logits = lg;
      first_eval = ev;
      first_shards = taken.shards;
    } else {
      EXPECT_EQ(lg, first_logits);
      EXPECT_EQ(ev, first_eval);
      EXPECT_EQ(taken.shards, first_shards);
    }
  }
}

// A host fixed-point sum as the trainer keeps one (HostExactGradientSum):
// per lane, every param's integers at one exponent and its largest |g|; and
// how each param's gradients came, by take (floats, converted here one
// micro-shard at a time) or through its sinks.
struct Sunk final : ShardGradients {
  static constexpr int kExponent = 30, kLimitBits = 58;
  Sunk(const Graph& g, int lanes)
      : g(g), acc(size_t(lanes), std::vector<int64_t>(g.num_params, 0)),
        max(size_t(lanes), std::vector<double>(g.params.size(), 0.0)), by_take(g.params.size(), 0),
        by_sinks(g.params.size(), 0) {}
  void take(int lane, const float* p, size_t first, size_t count) override {
    std::vector<fixed_point::Sink> to(count);
    point(lane, first, count, to.data(), by_take);
    for (size_t q = first; q < first + count; ++q)
      fixed_point::quantize_add(p + (g.params[q].offset - g.params[first].offset), g.params[q].numel, to[q - first]);
  }
  bool sinks(int lane, size_t first, size_t count, fixed_point::Sink* out) override {
    point(lane, first, count, out, by_sinks);
    return true;
  }
  void taken(size_t, size_t) override {}
  void point(int lane, size_t first, size_t count, fixed_point::Sink* out, std::vector<int>& calls) {
    {
      std::lock_guard<std::mutex> lock(mu);
      for (size_t q = first; q < first + count; ++q) ++calls[q];
    }
    for (size_t q = first; q < first + count; ++q)
      out[q - first] = {acc[size_t(lane)].data() + g.params[q].offset, kExponent, kLimitBits, &max[size_t(lane)][q]};
  }
  std::vector<int64_t> total() const {
    std::vector<int64_t> t(g.num_params, 0);
    for (const auto& a : acc)
      for (size_t i = 0; i < t.size(); ++i) t[i] += a[i];
    return t;
  }
  std::vector<double> largest() const {
    std::vector<double> m(g.params.size(), 0.0);
    for (const auto& l : max)
      for (size_t q = 0; q < m.size(); ++q) m[q] = std::max(m[q], l[q]);
    return m;
  }
  const Graph& g;
  std::mutex mu;
  std::vector<std::vector<int64_t>> acc;
  std::vector<std::vector<double>> max;
  std::vector<int> by_take, by_sinks;
};

// Note [fixed-point epilogue] (nn/cpu/packed_gemm.hpp): where the sums are the
// host's, a convolution whose micro-shards take their weight gradients by
// im2col's GEMM (16 channels on 4x4, as above) converts them itself, one
// call a run of micro-shards; the linear layer's come by take, a micro-shard
// at a time. The integers are the same at one, two and three lanes (runs of
// 3, 1 + 2 and 1 + 1 + 1 micro-shards), and they are the whole batch's
// gradients.
TEST(Model, MicroShardRunsConvertTheirWeightGradientsIntoFixedPointSinks) {
  constexpr int kBatch = 24, kShard = 8, kShards = kBatch / kShard, kClasses = 5;
  const auto graph = [] {
    GraphBuilder b("wide", {16, 4, 4}, /*pytorch_init=*/true);
    const int y = b.relu("relu", b.conv("conv", b.input(), 16, 3, 1, 1));
    return b.finish(b.linear("fc", b.flatten("flat", b.global_avg_pool("gap", y)), kClasses));
  };
  ASSERT_TRUE(cpu::shard_weight_grad_by_im2col(test::conv_geom(kShard, 16, 4, 4, 16, 3, 1, 1)));
  const Batch b = random_batch(kBatch, 23, 256, kClasses);
  const WholeBatch w(graph(), b, kBatch, kBatch, kClasses);
  std::vector<int64_t> first;
  std::vector<double> first_max;
  for (const int lanes : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(lanes) + " lanes");
    CpuModel sharded(graph(), 8, lanes);
    sharded->set_state(w.start);
    const Graph& g = sharded->graph();
    sharded->zero_grads();
    sharded->forward(b.x.data(), kBatch, Mode::Train, kShard);
    Sunk sunk(g, lanes);
    sharded->backward_shards(w.d.data(), kBatch, sunk);
    for (size_t q = 0; q < g.params.size(); ++q) {
      const bool conv = g.params[q].name.rfind("conv.", 0) == 0;
      if (conv && cpu::kFixedPointGemm) {
        EXPECT_EQ(sunk.by_sinks[q], std::min(lanes, kShards)) << g.params[q].name << ": not one call a run";
        EXPECT_EQ(sunk.by_take[q], 0) << g.params[q].name;
      } else {
        EXPECT_EQ(sunk.by_take[q], kShards) << g.params[q].name;
        EXPECT_EQ(sunk.by_sinks[q], 0) << g.params[q].name;
      }
    }
    EXPECT_EQ(*std::max_element(sharded->grads(), sharded->grads() + g.num_params), 0.0f);
    EXPECT_EQ(*std::min_element(sharded->grads(), sharded->grads() + g.num_params), 0.0f);
    const std::vector<int64_t> t = sunk.total();
    std::vector<double> sum(t.size());
    for (size_t i = 0; i < t.size(); ++i) sum[i] = std::ldexp(double(t[i]), -Sunk::kExponent);
    EXPECT_LT(test::scaled_err(w.grads, sum), 1e-5);
    if (lanes == 1) {
      first = t;
      first_max = sunk.largest();
    } else {
      EXPECT_EQ(t, first) << "the sums are not one lane's";
      EXPECT_EQ(sunk.largest(), first_max);
    }
  }
}

// Note [shard runs]: every micro-shard in exactly one call, the whole ones
// in one contiguous run a lane, as even as they split, and an evaluation's
// last, smaller micro-shard in a call of its own.
TEST(Model, ShardRunsCoverTheBatchOneRunALane) {
  struct Case {
    int batch, shard, lanes;
    std::vector<std::pair<int64_t, int64_t>> runs;  // first, count
  };
  const Case cases[] = {{128, 8, 1, {{0, 16}}},
                        {64, 8, 2, {{0, 4}, {4, 4}}},
                        {12, 3, 3, {{0, 1}, {1, 1}, {2, 2}}},
                        {11, 3, 2, {{0, 1}, {1, 2}, {3, 1}}},
                        {8, 8, 4, {{0, 1}}},
                        {2, 3, 2, {{0, 1}}}};
  for (const Case& c : cases) {
    std::vector<std::pair<int64_t, int64_t>> got;
    for (const ShardRun& r : shard_runs_on_lanes(c.batch, c.shard, c.lanes)) got.emplace_back(r.first, r.count);
    EXPECT_EQ(got, c.runs) << c.batch << " in shards of " << c.shard << " on " << c.lanes << " lanes";
  }
  EXPECT_THROW(shard_runs_on_lanes(8, 0, 1), Error);
}

TEST(Model, BackwardNeedsATrainingForwardOfTheBatch) {
  CpuModel m = cpu_model("mlp");
  const Batch b = random_batch(4, 1);
  m->forward(b.x.data(), 4);
  std::vector<float> d(40, 0.0f);
  EXPECT_THROW(m->backward(d.data(), 3), Error);
  // After evaluation, in one piece or in micro-shards, the error says what
  // is missing: a training forward.
  for (int shard : {0, 2}) {
    m->forward(b.x.data(), 4, Mode::Eval, shard);
    try {
      m->backward(d.data(), 4);
      ADD_FAILURE() << "backward after an evaluation forward (shard " << shard << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("without a training forward"), std::string::npos) << e.what();
    }
  }
}

TEST(ModelGraph, UnknownNameListsKnownModels) {
  EXPECT_EQ(known_models(), (std::vector<std::string>{"lenet", "mlp", "resnet18"}));
  try {
    model_graph("foo", {1, 28, 28}, 10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "unknown model 'foo' (known: lenet, mlp, resnet18)");
  }
}

TEST(ModelGraph, LenetChecksInputShape) {
  try {
    model_graph("lenet", {3, 32, 32}, 10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1x28x28"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3x32x32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model_graph("lenet", {1, 28, 28}, 0), Error);
  // The MLP takes any input; its fc1 follows the input size.
  const Graph g = model_graph("mlp", {3, 8, 8}, 5);
  EXPECT_EQ(g.params[2].shape, (std::vector<int64_t>{256, 192}));
  EXPECT_EQ(g.output_shape(), (Shape{5, 1, 1}));
}

// Note [gradient slots]: values whose gradients share an array are never
// live in backward at once (a gradient lives from its last reader's backward
// to its producer's), every slot is as large as its largest value, and
// ResNet-18 needs few arrays where it has a gradient per value.
TEST(ModelGraph, GradientSlotsAreSharedOnlyBetweenDisjointSpans) {
  for (const char* name : {"lenet", "mlp", "resnet18"}) {
    const Graph g = model_graph(name, {1, 28, 28}, 10);
    ASSERT_EQ(g.grad_slot.size(), g.values.size()) << name;
    std::vector<int> last_reader(g.values.size(), -1);
    for (size_t i = 0; i < g.ops.size(); ++i)
      for (int v : g.ops[i].inputs) last_reader[size_t(v)] = std::max(last_reader[size_t(v)], int(i));
    int with_grad = 0;
    for (size_t v = 0; v < g.values.size(); ++v) {
      const bool needs = v > 0 && int(v) != g.output && last_reader[v] >= 0;
      ASSERT_EQ(g.grad_slot[v] >= 0, needs) << name << " value " << v;
      with_grad += needs;
      ASSERT_LT(g.grad_slot[v], g.grad_slots) << name;
      for (size_t u = 1; u < v && needs; ++u) {
        if (g.grad_slot[u] != g.grad_slot[v]) continue;
        const bool disjoint = int(v) - 1 > last_reader[u] || int(u) - 1 > last_reader[v];
        EXPECT_TRUE(disjoint) << name << ": values " << u << " and " << v << " share slot " << g.grad_slot[v]
                              << " while both are live";
      }
    }
    if (std::string(name) == "resnet18") {
      EXPECT_GT(with_grad, 50);
      EXPECT_LE(g.grad_slots, 8) << with_grad << " gradients; backward should need a few arrays, not one per value";
    }
  }
}

TEST(ModelGraph, BadWiringIsNamed) {
  GraphBuilder gb("bad", {3, 8, 8}, true);
  const int a = gb.conv("a", gb.input(), 4, 3, 1, 1);
  const int b = gb.conv("b", gb.input(), 5, 3, 1, 1);
  try {
    gb.add("sum", a, b, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "model bad: op sum: adds 4x8x8 and 5x8x8");
  }
  EXPECT_THROW(gb.conv("a", gb.input(), 4, 3), Error) << "two ops named a";
  EXPECT_THROW(gb.conv("big", gb.input(), 4, 11), Error) << "kernel larger than the input";
}

}  // namespace
}  // namespace ddp::nn
