// Model: flat layout, ready-prefix callbacks, init, accumulation, training,
// the fused LeNet against the unfused one, and make_model's checks.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"
#include "ddp/nn/layers.hpp"
#include "ddp/nn/model.hpp"
#include "grad_check.hpp"

namespace ddp::nn {
namespace {

constexpr size_t kLenetParams = (20 * 9 + 20) + (50 * 20 * 25 + 50) + (800 * 128 + 128) + (128 * 10 + 10);

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch random_batch(int n, uint64_t seed) {
  Rng rng(seed, 3);
  Batch b;
  b.x.resize(size_t(n) * 784);
  for (float& v : b.x) v = rng.uniform();
  for (int i = 0; i < n; ++i) b.y.push_back(int32_t(rng.below(10)));
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
  const float* logits = m.forward(b.x.data(), n);
  std::vector<float> d(size_t(n) * 10);
  const float loss = softmax_cross_entropy(logits, b.y.data(), n, 10, d.data());
  m.backward(d.data(), n, on_ready);
  return loss;
}

TEST(Model, LenetShapeAndParameterCount) {
  auto m = make_model("lenet", {1, 28, 28}, 10);
  EXPECT_EQ(m->num_params(), kLenetParams);
  EXPECT_EQ(m->output_shape(), (Shape{10, 1, 1}));
  EXPECT_EQ(m->input_shape(), (Shape{1, 28, 28}));
  EXPECT_EQ(m->name(), "lenet");
  auto mlp = make_model("mlp", {1, 28, 28}, 10);
  EXPECT_EQ(mlp->num_params(), size_t(784 * 256 + 256 + 256 * 10 + 10));
}

// Note [flat layout]: last layer first, weight before bias, no gaps.
TEST(Model, FlatLayoutIsBackwardOrder) {
  auto m = make_model("lenet", {1, 28, 28}, 10);
  const auto& info = m->param_info();
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
  EXPECT_EQ(offset, m->num_params());
  EXPECT_EQ(info[0].shape, (std::vector<int64_t>{10, 128}));
  EXPECT_EQ(info[6].shape, (std::vector<int64_t>{20, 1, 3, 3}));
}

// The reducer's contract: prefixes never shrink, end at num_params, and each
// reported prefix is final (a later layer's backward leaves it unchanged).
TEST(Model, OnReadyPrefixesGrowAndAreFinal) {
  auto m = make_model("lenet", {1, 28, 28}, 10);
  m->init_params(1);
  const Batch b = random_batch(8, 2);
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
  EXPECT_GT(prefixes.front(), 0u) << "fc2's gradients are ready after the last layer";
  EXPECT_LT(prefixes.front(), m->num_params());
  for (size_t i = 0; i < prefixes.size(); ++i)
    for (size_t j = 0; j < prefixes[i]; ++j)
      ASSERT_EQ(snapshots[i][j], m->grads()[j]) << "prefix " << prefixes[i] << " changed at " << j;
}

TEST(Model, BackwardTwiceAccumulatesDoubleGradients) {
  auto m = make_model("lenet", {1, 28, 28}, 10);
  m->init_params(3);
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

TEST(Model, InitIsNormal001WeightsZeroBiasesAndSeeded) {
  auto m = make_model("lenet", {1, 28, 28}, 10);
  m->init_params(7);
  for (const auto& p : m->param_info()) {
    const float* v = m->params() + p.offset;
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
  auto same = make_model("lenet", {1, 28, 28}, 10);
  same->init_params(7);
  auto other = make_model("lenet", {1, 28, 28}, 10);
  other->init_params(8);
  size_t equal = 0;
  for (size_t i = 0; i < m->num_params(); ++i) {
    ASSERT_EQ(m->params()[i], same->params()[i]) << i;
    equal += m->params()[i] == other->params()[i];
  }
  EXPECT_LT(equal, m->num_params() / 10 + 1000) << "seed 8 should differ from seed 7 (biases are equal)";
}

TEST(Model, SgdStepsReduceTheLoss) {
  for (const char* name : {"lenet", "mlp"}) {
    auto m = make_model(name, {1, 28, 28}, 10);
    m->init_params(11);
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

TEST(Model, ResultsDoNotDependOnThreads) {
  auto one = make_model("lenet", {1, 28, 28}, 10);
  auto two = make_model("lenet", {1, 28, 28}, 10);
  one->set_threads(1);
  two->set_threads(2);
  EXPECT_EQ(two->threads(), 2);
  one->init_params(5);
  two->init_params(5);
  const Batch b = random_batch(37, 6);
  one->zero_grads();
  two->zero_grads();
  const float l1 = step(*one, b), l2 = step(*two, b);
  EXPECT_NEAR(l1, l2, 1e-6f);
  const std::vector<double> g1(one->grads(), one->grads() + one->num_params());
  const std::vector<float> g2(two->grads(), two->grads() + two->num_params());
  EXPECT_LT(test::scaled_err(g2, g1), 1e-5);
}

// The layers make OpenBLAS single-threaded only while they run (Note [serial
// OpenBLAS]): the count World set is back after a step, and the next model
// still takes it as its thread count.
TEST(Model, StepLeavesOpenBlasThreadsAlone) {
  const int before = openblas_get_num_threads();
  openblas_set_num_threads(2);
  auto m = make_model("lenet", {1, 28, 28}, 10);
  EXPECT_EQ(m->threads(), 2);
  m->init_params(3);
  step(*m, random_batch(20, 12));
  EXPECT_EQ(openblas_get_num_threads(), 2);
  EXPECT_EQ(make_model("mlp", {1, 28, 28}, 10)->threads(), 2);
  openblas_set_num_threads(before);
}

// make_model's LeNet fuses conv -> relu -> pool; the same model built from
// the separate layers must compute the same thing.
TEST(Model, FusedLenetMatchesUnfusedLayers) {
  const Shape in{1, 28, 28};
  std::vector<std::unique_ptr<Layer>> layers;
  Shape s = in;
  auto add = [&](std::unique_ptr<Layer> l) {
    s = l->output_shape(s);
    layers.push_back(std::move(l));
  };
  add(std::make_unique<Conv2d>("conv1", s, 20, 3));
  add(std::make_unique<ReLU>("relu1", s));
  add(std::make_unique<AvgPool2d>("pool1", s));
  add(std::make_unique<Conv2d>("conv2", s, 50, 5));
  add(std::make_unique<ReLU>("relu2", s));
  add(std::make_unique<AvgPool2d>("pool2", s));
  add(std::make_unique<Flatten>("flatten", s));
  add(std::make_unique<Linear>("fc1", int(s.numel()), 128));
  add(std::make_unique<ReLU>("relu3", s));
  add(std::make_unique<Linear>("fc2", 128, 10));
  Model unfused("lenet-unfused", in, std::move(layers));
  auto fused = make_model("lenet", in, 10);
  ASSERT_EQ(unfused.num_params(), fused->num_params());
  fused->init_params(9);
  std::copy(fused->params(), fused->params() + fused->num_params(), unfused.params());
  // Larger weights than the N(0, 0.01) init so every layer's signal matters.
  for (size_t i = 0; i < fused->num_params(); ++i) fused->params()[i] = unfused.params()[i] *= 10;

  const Batch b = random_batch(9, 10);
  fused->zero_grads();
  unfused.zero_grads();
  const float* pf = fused->forward(b.x.data(), 9);
  const std::vector<float> lf(pf, pf + 90);
  const float* pu = unfused.forward(b.x.data(), 9);
  const std::vector<float> lu(pu, pu + 90);
  const std::vector<double> lud(lu.begin(), lu.end());
  EXPECT_LT(test::scaled_err(lf, lud), 1e-5);
  step(*fused, b);
  step(unfused, b);
  const std::vector<double> gu(unfused.grads(), unfused.grads() + unfused.num_params());
  const std::vector<float> gf(fused->grads(), fused->grads() + fused->num_params());
  EXPECT_LT(test::scaled_err(gf, gu), 1e-5);
}

TEST(Model, BackwardNeedsTheForwardBatch) {
  auto m = make_model("mlp", {1, 28, 28}, 10);
  const Batch b = random_batch(4, 1);
  m->forward(b.x.data(), 4);
  std::vector<float> d(30, 0.0f);
  EXPECT_THROW(m->backward(d.data(), 3), Error);
}

TEST(MakeModel, UnknownNameListsKnownModels) {
  EXPECT_EQ(known_models(), (std::vector<std::string>{"lenet", "mlp"}));
  try {
    make_model("foo", {1, 28, 28}, 10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "unknown model 'foo' (known: lenet, mlp)");
  }
}

TEST(MakeModel, LenetChecksInputShape) {
  try {
    make_model("lenet", {3, 32, 32}, 10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1x28x28"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3x32x32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_model("lenet", {1, 28, 28}, 0), Error);
  // The MLP takes any input; its fc1 follows the input size.
  auto m = make_model("mlp", {3, 8, 8}, 5);
  EXPECT_EQ(m->param_info()[2].shape, (std::vector<int64_t>{256, 192}));
  EXPECT_EQ(m->output_shape(), (Shape{5, 1, 1}));
}

}  // namespace
}  // namespace ddp::nn
