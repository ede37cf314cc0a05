// CheckedRuns (deterministic/checked_runs.hpp, Note [checked runs]) under
// ShardedModel on a device of one lane, as a GPU's: the CPU's kernels, each
// call counted, one of them made to depend on its call's batch. A batch's
// micro-shards in one checked call are the bits of one call each; a kernel
// that fails the check runs micro-shard by micro-shard, said once.
#include "ddp/deterministic/checked_runs.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../nn/model_util.hpp"  // Batch, random_batch, tiny_resnet
#include "ddp/core/error.hpp"   // DDP_FAIL
#include "ddp/core/scoped.hpp"  // Scoped
#include "ddp/deterministic/devices.hpp"
#include "ddp/deterministic/sharded_model.hpp"
#include "ddp/nn/model.hpp"  // softmax_cross_entropy, init_state

namespace ddp::deterministic {
namespace {

using nn::Graph;
using nn::Mode;
using nn::OpArgs;

constexpr int kBatch = 12, kShard = 3, kShards = kBatch / kShard, kClasses = 5;

struct Calls {
  int forward = 0, backward = 0, biases = 0;  // biases: bias_grads_of_shards's
  int spread = 0;  // backward calls made within the device's on_streams
};

// How a kernel behaves on a call of more than one micro-shard: as the
// CPU's; its first sample's first output (and input gradient) one bit off,
// as a library kernel that chose another algorithm for a larger batch would
// be; or failing, as cuDNN with no deterministic algorithm for it.
enum class Skew { None, Bit, Fails };

// The CPU's plain kernel of one op, its calls counted, skewed. With a
// graph (a convolution's): it takes every micro-shard's bias gradients at
// once, as its own backward calls micro-shard by micro-shard would. Its
// calls may run at once on streams where they take no bias gradient (as
// the GPU's convolution where it sums the bias into a buffer of its own).
class Counted final : public nn::Kernel, public ShardBias, public ConcurrentShards {
 public:
  Counted(std::unique_ptr<nn::Kernel> inner, Calls& calls, Skew skew, const bool& spreading,
          const Graph* g = nullptr, size_t op = 0)
      : inner_(std::move(inner)), calls_(calls), skew_(skew), spreading_(spreading), g_(g), op_(op) {}
  bool concurrent_shard_calls(bool bias) const override { return !bias; }
  bool bias_grads_of_shards(const OpArgs& a, const float* dy, int shard, int shards, float* bias,
                            size_t stride) override {
    if (!g_) return false;
    ++calls_.biases;
    const int64_t in = g_->values[size_t(g_->ops[op_].inputs[0])].numel(), out = g_->values[op_ + 1].numel();
    std::vector<float> dw(g_->params[g_->op_params[op_].front()].numel);  // discarded
    for (int k = 0; k < shards; ++k) {
      OpArgs part = a;
      part.batch = shard;
      part.x[0] += int64_t(k) * shard * in;
      part.y += int64_t(k) * shard * out;
      part.dp = {dw.data(), bias + size_t(k) * stride};
      inner_->backward(part, dy + int64_t(k) * shard * out, {nullptr});
    }
    return true;
  }
  void forward(const OpArgs& a) override {
    ++calls_.forward;
    refuse(a.batch);
    inner_->forward(a);
    if (skew_ == Skew::Bit && a.batch > kShard) nudge(a.y);
  }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    ++calls_.backward;
    calls_.spread += spreading_;
    refuse(a.batch);
    inner_->backward(a, dy, dx);
    if (skew_ == Skew::Bit && a.batch > kShard && dx[0]) nudge(dx[0]);
  }

 private:
  void refuse(int batch) const {
    if (skew_ == Skew::Fails && batch > kShard) DDP_FAIL("no algorithm for a batch of ", batch);
  }
  static void nudge(float* v) {
    uint32_t bits;
    std::memcpy(&bits, v, sizeof bits);
    bits ^= 1u;
    std::memcpy(v, &bits, sizeof bits);
  }
  std::unique_ptr<nn::Kernel> inner_;
  Calls& calls_;
  Skew skew_;
  const bool& spreading_;  // the device's: within on_streams
  const Graph* g_;
  size_t op_;
};

// The CPU's deterministic device with one lane, whose checkable ops run the
// CPU's plain kernels (counted; the op named `skewed` skewed by `skew`): in
// CheckedRuns where `checked`, else one call a micro-shard (the reference);
// without lanes, its micro-shards' gradients taken together, as a GPU's;
// with `streams`, calls run "at once" (Note [shard streams]): here the last
// first, as streams may finish in any order.
class OneLaneDevice : public nn::Device, public ShardsTogether, public ShardStreams {
 public:
  OneLaneDevice(bool checked, std::string skewed = "", Skew skew = Skew::None, bool biases = false,
                bool streams = false)
      : checked_(checked), skewed_(std::move(skewed)), skew_(skew), biases_(biases), streams_(streams) {}
  std::string name() const override { return "one-lane cpu"; }
  bool shard_gradients_together() const override { return true; }
  void on_streams(int64_t n, const std::function<void(int64_t)>& body) override {
    Scoped<bool> spreading(spreading_, streams_);
    for (int64_t i = n - 1; i >= 0; --i) body(i);
  }
  std::unique_ptr<nn::Kernel> kernel(const Graph& g, size_t i, nn::StatsReducer* stats) override {
    const nn::Op& op = g.ops[i];
    if (!checkable_in_runs(op.kind)) return shards_->kernel(g, i, stats);
    const bool conv = biases_ && op.kind == nn::OpKind::Conv2d;
    auto counted = std::make_unique<Counted>(plain_->kernel(g, i, stats), calls[op.name],
                                             op.name == skewed_ ? skew_ : Skew::None, spreading_,
                                             conv ? &g : nullptr, i);
    if (!checked_) return counted;
    CheckedRuns::Env env;
    env.device = this;
    env.same_bits = [](const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; };
    env.say_once = [this](const std::string& key, const std::string& what) {
      if (said.emplace(key, what).second) ++says;
    };
    env.after_failure = [this] { ++cleared; };
    return std::make_unique<CheckedRuns>(g, i, std::move(counted), std::move(env));
  }
  std::unique_ptr<nn::Array> alloc(size_t n) override { return shards_->alloc(n); }
  void fill(float* p, size_t n, float value) override { shards_->fill(p, n, value); }
  void add(float* dst, const float* src, size_t n) override { shards_->add(dst, src, n); }
  void scale(float* p, size_t n, float s) override { shards_->scale(p, n, s); }
  void round(float* dst, const float* src, size_t n, nn::Precision p) override { shards_->round(dst, src, n, p); }
  void to_host(float* host, const float* dev, size_t n) override { shards_->to_host(host, dev, n); }
  void from_host(float* dev, const float* host, size_t n) override { shards_->from_host(dev, host, n); }
  void sync() override {}
  OneLaneDevice reference() const { return OneLaneDevice(false, skewed_, skew_); }

  std::map<std::string, Calls> calls;      // per op name (held by the kernels)
  std::map<std::string, std::string> said;  // say_once's, by key
  int says = 0;
  int cleared = 0;  // after_failure's calls

 private:
  bool checked_;
  std::string skewed_;
  Skew skew_;
  bool biases_;  // its convolutions take their micro-shards' bias gradients at once
  bool streams_;  // on_streams runs its calls last first, as at once
  bool spreading_ = false;  // within on_streams
  std::unique_ptr<nn::Device> shards_ = make_cpu_device(1), plain_ = nn::make_cpu_device(1);
};

// A device of one lane as the CPU's are (Lanes): each micro-shard's
// gradients taken on their own.
class LanedDevice final : public OneLaneDevice, public Lanes {
 public:
  using OneLaneDevice::OneLaneDevice;
  int lanes() const override { return 1; }
  void for_lanes(int64_t n, const std::function<void(int64_t, int)>& body) override {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
  }
};

struct Grads final : ShardGradients {
  explicit Grads(const Graph& g) : g(g), shards(g.params.size()) {}
  void take_shards(int lane, const float* p, size_t stride, int n, size_t first, size_t count) override {
    ++together;
    ShardGradients::take_shards(lane, p, stride, n, first, count);
  }
  void take(int, const float* p, size_t first, size_t count) override {
    const size_t base = g.params[first].offset;
    for (size_t q = first; q < first + count; ++q)
      shards[q].emplace_back(p + (g.params[q].offset - base), p + (g.params[q].offset - base) + g.params[q].numel);
  }
  void taken(size_t, size_t) override {}
  const Graph& g;
  std::vector<std::vector<std::vector<float>>> shards;  // per param, per micro-shard
  int together = 0;  // take_shards' calls
};

// What a model on such a device computes in two training steps' forward and
// backward (no update between) and an evaluation of 11 samples, and the
// calls its ops took in the second step.
struct Steps {
  std::vector<float> logits, eval;
  std::vector<std::vector<std::vector<float>>> grads;
  std::map<std::string, Calls> first, second;  // calls in the first and the second step
  int together = 0;  // the last step's take_shards calls
};

Steps run(OneLaneDevice& device, const nn::test::Batch& b) {
  ShardedModel model(nn::test::tiny_resnet(kClasses), device);
  model.set_state(nn::init_state(model.graph(), 5));
  Steps s;
  for (int step = 0; step < 2; ++step) {
    if (step == 1) {
      s.first = device.calls;
      for (auto& [op, calls] : device.calls) calls = Calls{};  // the kernels hold them
    }
    model.zero_grads();
    const float* l = model.forward_shards(b.x.data(), kBatch, Mode::Train, kShard);
    s.logits.assign(l, l + kBatch * kClasses);
    std::vector<float> d(s.logits.size());
    nn::softmax_cross_entropy(l, b.y.data(), kBatch, kClasses, d.data());
    Grads g(model.graph());
    model.backward_shards(d.data(), kBatch, g);
    s.grads = g.shards;
    s.together = g.together;
  }
  s.second = device.calls;
  const float* e = model.forward_shards(b.x.data(), 11, Mode::Eval, kShard);  // a last micro-shard of 2
  s.eval.assign(e, e + 11 * kClasses);
  return s;
}

// `checked`'s steps on a batch from `seed`, each value the bits of the same
// kernels called once a micro-shard.
Steps checked_steps(OneLaneDevice& checked, uint64_t seed) {
  const nn::test::Batch b = nn::test::random_batch(kBatch, seed, 2 * 8 * 8, kClasses);
  OneLaneDevice reference = checked.reference();
  const Steps want = run(reference, b), got = run(checked, b);
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.eval, want.eval);
  EXPECT_EQ(got.grads, want.grads);
  for (const auto& [op, calls] : want.second) EXPECT_EQ(calls.forward, kShards) << op;
  return got;
}

// Every checkable op of the tiny ResNet (convolutions, ReLUs, residual adds,
// the pool, flatten, fc) passes its check and takes the batch's micro-shards
// in one call forward and one backward (plus the weight gradients' calls,
// one a micro-shard); logits, evaluation and each micro-shard's gradients
// are the bits of one call a micro-shard.
TEST(CheckedRuns, MicroShardsInOneCallAreEachMicroShardsOwnBits) {
  OneLaneDevice checked(true);
  const Steps got = checked_steps(checked, 31);
  EXPECT_EQ(checked.says, 0);
  ASSERT_FALSE(got.second.empty());
  for (const auto& [op, calls] : got.second) {
    SCOPED_TRACE(op);
    EXPECT_EQ(calls.forward, 1);
    const bool weights = op.find("conv") != std::string::npos || op == "fc";
    // The stem's convolution has no input gradient: micro-shard calls only.
    const int backward = op == "stem.conv" ? kShards : weights ? 1 + kShards : 1;
    EXPECT_EQ(calls.backward, backward);
  }
}

// A kernel whose one call over several micro-shards differs by a bit fails
// its check: the step still has the micro-shards' own bits, the device says
// so once, and from then on that op runs micro-shard by micro-shard while
// the others keep their one call.
TEST(CheckedRuns, AKernelThatDependsOnItsBatchRunsMicroShardByMicroShard) {
  OneLaneDevice checked(true, "block0.relu1", Skew::Bit);
  const Steps got = checked_steps(checked, 32);
  ASSERT_EQ(checked.says, 3) << "once forward, once backward, once in evaluation";
  std::string all;
  for (const auto& [key, what] : checked.said) all += what + "\n";
  for (const char* run : {"12 (forward)", "12 (backward)", "11 (evaluation)"})
    EXPECT_NE(all.find(std::string("op block0.relu1: one call over the micro-shards of a batch of ") + run +
                       " does not give each micro-shard its own bits; it runs micro-shard by micro-shard\n"),
              std::string::npos)
        << all;
  EXPECT_EQ(got.second.at("block0.relu1").forward, kShards);
  EXPECT_EQ(got.second.at("block0.relu1").backward, kShards);
  EXPECT_EQ(got.second.at("block1.add").forward, 1);
  EXPECT_EQ(got.second.at("block1.add").backward, 1);
}

// A one call that fails (cuDNN without a deterministic algorithm for the
// larger batch) is a failed check, not a failed run: said once with its
// error, what it left behind cleared (the GPU's last error), the op then
// runs micro-shard by micro-shard.
TEST(CheckedRuns, AOneCallThatFailsRunsMicroShardByMicroShard) {
  OneLaneDevice checked(true, "block1.conv1", Skew::Fails);
  const Steps got = checked_steps(checked, 33);
  ASSERT_EQ(checked.says, 3) << "once forward, once backward, once in evaluation";
  EXPECT_EQ(checked.cleared, 3) << "after each failed call";
  EXPECT_NE(checked.said.begin()->second.find("op block1.conv1: one call over the micro-shards of a batch of "),
            std::string::npos);
  EXPECT_NE(checked.said.begin()->second.find(" failed (no algorithm for a batch of "), std::string::npos)
      << checked.said.begin()->second;
  EXPECT_EQ(got.second.at("block1.conv1").forward, kShards);
  EXPECT_EQ(got.second.at("block1.conv1").backward, kShards);
  EXPECT_EQ(got.second.at("block1.add").forward, 1);
}

// Note [shard gradients together]: on a device without lanes an op's
// micro-shards' parameter gradients are handed over in one take_shards,
// each micro-shard's the bits it has when taken alone (a lane's).
// With checked runs (one call for the convolutions' input gradients) and
// the convolutions' bias gradients summed for every micro-shard at once
// (ShardBias), the micro-shards' own calls then take no bias gradient.
TEST(ShardGradients, WithoutLanesAnOpsMicroShardsAreTakenTogether) {
  const nn::test::Batch b = nn::test::random_batch(kBatch, 34, 2 * 8 * 8, kClasses);
  for (const bool checked : {false, true}) {
    SCOPED_TRACE(checked ? "checked runs, biases together" : "micro-shard calls");
    OneLaneDevice together(checked, "", Skew::None, /*biases=*/checked);
    LanedDevice one_by_one(false);
    const Steps got = run(together, b), want = run(one_by_one, b);
    EXPECT_EQ(got.logits, want.logits);
    EXPECT_EQ(got.grads, want.grads);
    EXPECT_EQ(want.together, 0);
    // The tiny ResNet's six convolutions and fc (BatchNorm hands its
    // micro-shards over as it sums them).
    EXPECT_EQ(got.together, 7);
    for (const auto& [op, calls] : got.second)
      EXPECT_EQ(calls.biases, checked && op.find("conv") != std::string::npos ? 1 : 0) << op;
  }
}

// Note [shard streams]: on a device that runs calls at once, an op's
// micro-shards' backward calls are spread over its streams from the op's
// second backward on, where the kernel allows it (here: where the calls
// take no bias gradient), and each micro-shard's gradients are still the
// bits of its own call.
TEST(ShardStreams, MicroShardCallsAtOnceFromAnOpsSecondBackwardAreTheirOwnBits) {
  const nn::test::Batch b = nn::test::random_batch(kBatch, 35, 2 * 8 * 8, kClasses);
  for (const bool biases : {false, true}) {
    SCOPED_TRACE(biases ? "biases together: calls without one" : "calls with their bias");
    OneLaneDevice streams(/*checked=*/biases, "", Skew::None, biases, /*streams=*/true);
    LanedDevice one_by_one(false);
    const Steps got = run(streams, b), want = run(one_by_one, b);
    EXPECT_EQ(got.logits, want.logits);
    EXPECT_EQ(got.grads, want.grads);
    for (const auto& [op, calls] : got.first) EXPECT_EQ(calls.spread, 0) << op;
    // The tiny ResNet's convolutions (fc's calls take their bias gradient).
    int spread = 0;
    for (const auto& [op, calls] : got.second) {
      const bool conv = op.find("conv") != std::string::npos;
      EXPECT_EQ(calls.spread, conv && biases ? kShards : 0) << op;
      spread += calls.spread;
    }
    EXPECT_EQ(spread, biases ? 6 * kShards : 0);
  }
}

TEST(CheckedRuns, OnlyOpsWithoutBatchStatisticsOrKeptSamplesAreChecked) {
  EXPECT_TRUE(checkable_in_runs(nn::OpKind::Conv2d));
  EXPECT_TRUE(checkable_in_runs(nn::OpKind::Add));
  EXPECT_TRUE(checkable_in_runs(nn::OpKind::Linear));
  EXPECT_FALSE(checkable_in_runs(nn::OpKind::BatchNorm2d));
  EXPECT_FALSE(checkable_in_runs(nn::OpKind::ConvReluPool));
}

}  // namespace
}  // namespace ddp::deterministic
