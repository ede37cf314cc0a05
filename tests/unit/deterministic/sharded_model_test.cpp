// ShardedModel (deterministic/sharded_model.hpp) on the CPU's deterministic
// device: a batch run op by op in micro-shards on lanes is the whole batch's
// computation, each micro-shard's results one lane's bits at any number of
// lanes, in runs (Note [shard runs]), into fixed-point sinks (Note
// [fixed-point epilogue]) and in mixed precision.
#include "ddp/deterministic/sharded_model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../nn/cpu_model.hpp"   // CpuModel: the whole batch's reference
#include "../nn/grad_check.hpp"  // scaled_err, conv_geom
#include "../nn/model_util.hpp"  // Batch, random_batch, tiny_resnet, small_net, normal_values
#include "ddp/core/error.hpp"
#include "ddp/core/fixed_point.hpp"       // Sink, quantize_add
#include "ddp/deterministic/devices.hpp"  // make_cpu_device
#include "ddp/nn/cpu/ops.hpp"             // winograd_applies, winograd_applies_to_shards
#include "ddp/nn/cpu/packed_gemm.hpp"     // kFixedPointGemm
#include "ddp/nn/precision.hpp"

namespace ddp::deterministic {
namespace {

using nn::Graph;
using nn::GraphBuilder;
using nn::Mode;
using nn::ModelState;
using nn::Precision;
using nn::TensorInfo;
using nn::test::Batch;
using nn::test::CpuModel;
using nn::test::normal_values;
using nn::test::random_batch;
using nn::test::small_net;
using nn::test::tiny_resnet;
namespace cpu = nn::cpu;
namespace test = nn::test;

// A ShardedModel of g on the CPU's deterministic device with `threads`
// lanes, initialised as init_state(g, seed) says.
struct Sharded {
  std::unique_ptr<nn::Device> device;
  std::unique_ptr<ShardedModel> model;
  Sharded(Graph g, uint64_t seed, int threads)
      : device(make_cpu_device(threads)), model(std::make_unique<ShardedModel>(std::move(g), *device)) {
    model->set_state(nn::init_state(model->graph(), seed));
  }
  ShardedModel* operator->() { return model.get(); }
};

constexpr int kClasses = 10;

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
    nn::softmax_cross_entropy(lw, b.y.data(), batch, classes, d.data());
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
TEST(ShardedModel, MicroShardsOnLanesComputeWhatTheWholeBatchDoes) {
  constexpr int kBatch = 12, kShard = 3, kShards = kBatch / kShard, kEval = 11;
  for (const bool resnet : {true, false}) {
    const int classes = resnet ? 5 : 10;
    const auto graph = [&] { return resnet ? tiny_resnet() : nn::model_graph("lenet", {1, 28, 28}, 10); };
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
      Sharded sharded(graph(), 8, lanes);
      ASSERT_EQ(sharded->lanes(), lanes);
      sharded->set_state(start);
      const Graph& g = sharded->graph();
      const float* lse = sharded->forward_shards(b.x.data(), kEval, Mode::Eval, kShard);  // the last shard has 2
      const std::vector<float> ev(lse, lse + eval.size());
      EXPECT_LT(test::scaled_err(ev, eval), 1e-6);
      EXPECT_THROW(sharded->forward_shards(b.x.data(), kEval, Mode::Train, kShard), Error) << "3 does not divide 11";
      sharded->zero_grads();
      const float* ls = sharded->forward_shards(b.x.data(), kBatch, Mode::Train, kShard);
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
// share one transform of the kernels (LaneKernel::begin_shards): 16 channels on
// 4x4 images, micro-shards of 8 (32 2x2 blocks: winograd_applies_to_shards,
// not winograd_applies), their weight gradients by im2col's path
// (shard_weight_grad_by_im2col). Each micro-shard's logits and gradients are
// one lane's bits at one lane or two (on AVX-512, one call of three
// micro-shards against calls of one and two: Note [shard runs]), and they
// add up to the whole batch's; the evaluation's last, smaller micro-shard (6
// images) takes im2col's path.
TEST(ShardedModel, MicroShardsSharingWinogradKernelsAreOneLanesBits) {
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
    Sharded sharded(graph(), 8, lanes);
    sharded->set_state(w.start);
    const float* lse = sharded->forward_shards(b.x.data(), kEval, Mode::Eval, kShard);
    const std::vector<float> ev(lse, lse + w.eval.size());
    EXPECT_LT(test::scaled_err(ev, w.eval), 1e-5);
    sharded->zero_grads();
    const float* ls = sharded->forward_shards(b.x.data(), kBatch, Mode::Train, kShard);
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
TEST(ShardedModel, MicroShardRunsConvertTheirWeightGradientsIntoFixedPointSinks) {
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
    Sharded sharded(graph(), 8, lanes);
    sharded->set_state(w.start);
    const Graph& g = sharded->graph();
    sharded->zero_grads();
    sharded->forward_shards(b.x.data(), kBatch, Mode::Train, kShard);
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
TEST(ShardedModel, ShardRunsCoverTheBatchOneRunALane) {
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

// Note [lanes]: in micro-shards each shard's gradients are rounded on its
// lane; the same bits at one lane and at three, and the logits those of the
// whole batch (every rounding is per element).
TEST(ShardedModel, MixedPrecisionMicroShardsOnLanesRoundTheirOwnGradients) {
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
  const std::vector<float> x = normal_values(size_t(batch) * 50, 4), d = normal_values(size_t(batch) * kClasses, 5, 0.1);
  CpuModel whole(g, 3);
  whole->set_precision(Precision::BF16);
  const float* lw = whole->forward(x.data(), batch);
  const std::vector<float> whole_logits(lw, lw + batch * kClasses);
  std::vector<std::vector<float>> by_lanes[2];
  for (int t = 0; t < 2; ++t) {
    Sharded m(g, 3, t == 0 ? 1 : 3);
    m->set_precision(Precision::BF16);
    const float* l = m->forward_shards(x.data(), batch, Mode::Train, shard);
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

TEST(ShardedModel, BackwardNeedsATrainingForwardOfTheBatch) {
  Sharded m(nn::model_graph("mlp", {1, 28, 28}, 10), 0, 1);
  const Batch b = random_batch(4, 1);
  std::vector<float> d(40, 0.0f);
  // After evaluation in micro-shards the error says what is missing.
  m->forward_shards(b.x.data(), 4, Mode::Eval, 2);
  try {
    m->backward(d.data(), 4);
    ADD_FAILURE() << "backward after an evaluation forward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without a training forward"), std::string::npos) << e.what();
  }
  // A training forward in micro-shards takes backward_shards.
  m->forward_shards(b.x.data(), 4, Mode::Train, 2);
  try {
    m->backward(d.data(), 4);
    ADD_FAILURE() << "backward of a forward in micro-shards";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs backward_shards"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::deterministic
