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
#include <set>
#include <string>
#include <vector>

#include "cpu_model.hpp"
#include "model_util.hpp"  // Batch, random_batch, tiny_resnet
#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/nn/model.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"
#include "grad_check.hpp"

namespace ddp::nn {
namespace {

using test::CpuModel;
using test::cpu_model;
using test::Batch;
using test::random_batch;
using test::tiny_resnet;

constexpr size_t kLenetParams = (20 * 9 + 20) + (50 * 20 * 25 + 50) + (800 * 128 + 128) + (128 * 10 + 10);

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

TEST(Model, LenetShapeAndParameterCount) {
  const Graph g = model_graph("lenet", {1, 28, 28}, 10);
  EXPECT_EQ(g.parameter_count, kLenetParams);
  EXPECT_EQ(g.output_shape(), (Shape{10, 1, 1}));
  EXPECT_EQ(g.input, (Shape{1, 28, 28}));
  EXPECT_EQ(g.model, "lenet");
  EXPECT_EQ(g.num_buffers, 0u);
  EXPECT_EQ(model_graph("mlp", {1, 28, 28}, 10).parameter_count, size_t(784 * 256 + 256 + 256 * 10 + 10));
}

// Note [flat layout]: last op first, weight before bias, each starting on
// 256 bytes (fc2.bias's 10 floats leave no tensor after them off a 16-byte
// boundary), the slots partitioning the buffer.
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
    EXPECT_EQ(info[i].offset * sizeof(float) % 256, 0u) << info[i].name;
    offset += n;
    if (i + 1 < info.size()) offset = (offset + 63) / 64 * 64;
  }
  EXPECT_EQ(offset, g.num_params);
  EXPECT_GT(info[2].offset, info[1].offset + info[1].numel) << "fc2.bias's 10 floats and a gap";
  std::vector<size_t> slots;
  for (size_t i = 0; i + 1 < info.size(); ++i) slots.push_back(info[i + 1].offset - info[i].offset);
  slots.push_back(g.num_params - info.back().offset);
  EXPECT_EQ(param_slots(g), slots);
  EXPECT_EQ(g.parameter_count, kLenetParams);
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
    // Each on a slot's end (Note [flat layout]), where a bucket may end, so
    // that a bucket is ready with its last tensor, not with the next op's.
    std::set<size_t> ends = {m->num_params()};
    for (const TensorInfo& t : m->graph().params) ends.insert(t.offset);
    for (size_t n : prefixes) EXPECT_EQ(ends.count(n), 1u) << n;
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
  EXPECT_EQ(g.parameter_count, size_t(11175818));
  for (const TensorInfo& t : g.params) EXPECT_EQ(t.offset % kParamAlignment, 0u) << t.name;
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

TEST(Model, BackwardNeedsATrainingForwardOfTheBatch) {
  CpuModel m = cpu_model("mlp");
  const Batch b = random_batch(4, 1);
  m->forward(b.x.data(), 4);
  std::vector<float> d(40, 0.0f);
  EXPECT_THROW(m->backward(d.data(), 3), Error);
  // After evaluation the error says what is missing: a training forward.
  m->forward(b.x.data(), 4, Mode::Eval);
  try {
    m->backward(d.data(), 4);
    ADD_FAILURE() << "backward after an evaluation forward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without a training forward"), std::string::npos) << e.what();
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
