// Note [claimed runs] (nn/model.hpp): the executor runs a kernel that
// claims several ops as those ops, on the CPU. A test device claims every
// run of BatchNorm and the op after it (ReLU or the residual add) and the
// global pool with its flatten, running the CPU's own kernels in turn
// inside one Kernel: the model's logits, gradients, buffers, counters and
// ready prefixes must be the op-by-op run's, bit for bit. And runs headed
// by a convolution (what the GPU's conv-bn claims), which in bf16 and fp16
// make Note [mixed precision]'s roundings themselves, as the GPU's do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cuda/bn_runs.hpp"  // bn_act_run: what the GPU claims
#include "ddp/nn/device.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/nn/model.hpp"
#include "model_util.hpp"  // random_batch, tiny_resnet

namespace ddp::nn {
namespace {

// Ops first .. first + count - 1 of g as one kernel, each run by the CPU's
// kernel of that op, the values between them in arrays of its own. With
// `rounds`, a convolution heading the run computes in a 16-bit precision
// as the GPU's kernels do: every rounding Model makes around an op that
// runs alone, made here.
class RunKernel final : public Kernel {
 public:
  RunKernel(Device& cpu, const Graph& g, size_t first, size_t count, bool rounds = false)
      : cpu_(cpu), g_(g), first_(first), rounds_(rounds) {
    for (size_t k = first; k < first + count; ++k) ops_.push_back(cpu.kernel(g, k, nullptr));
  }
  size_t ops() const override { return ops_.size(); }
  bool set_precision(Precision p) override {
    precision_ = p;
    return rounds_;
  }

  void forward(const OpArgs& a) override {
    split(a);
    if (half()) round_head_forward(a);
    for (size_t k = 0; k < ops_.size(); ++k) {
      ops_[k]->forward(args_[k]);
      if (k == 0 && half())
        cpu_.round(args_[0].y, args_[0].y, size_t(a.batch) * g_.ops[first_].out.numel(), precision_);
    }
  }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    split(a);
    if (half()) round_head_forward(a);  // the rounded weights
    size_t outside = dx.size();
    for (size_t k = ops_.size(); k-- > 0;) {
      const Op& op = g_.ops[first_ + k];
      std::vector<float*> dxk(op.inputs.size());
      // The outside inputs' gradients are dx's last ones for the last op.
      for (size_t j = op.inputs.size(); j-- > 0;)
        dxk[j] = k > 0 && op.inputs[j] == int(first_ + k) ? dinner_[k - 1]->data() : dx[--outside];
      const float* dyk = k + 1 == ops_.size() ? dy : dinner_[k]->data();
      if (k == 0 && half())
        rounded_head_backward(a, dyk, dxk);
      else
        ops_[k]->backward(args_[k], dyk, dxk);
    }
  }

 private:
  bool half() const { return rounds_ && is_half(precision_); }
  size_t param_numel(size_t j) const { return g_.params[g_.op_params[first_][j]].numel; }
  // The head's input and weights rounded (Model::forward's roundings).
  void round_head_forward(const OpArgs& a) {
    OpArgs& o = args_[0];
    const size_t nx = size_t(a.batch) * g_.ops[first_].in.numel();
    grow(x_half_, nx);
    cpu_.round(x_half_->data(), o.x[0], nx, precision_);
    o.x[0] = x_half_->data();
    w_half_.resize(o.p.size());
    for (size_t j = 0; j < o.p.size(); ++j) {
      grow(w_half_[j], param_numel(j));
      cpu_.round(w_half_[j]->data(), o.p[j], param_numel(j), precision_);
      o.p[j] = w_half_[j]->data();
    }
  }
  // Its backward as Model's rounded_backward and backward make it.
  void rounded_head_backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
    OpArgs& o = args_[0];
    const size_t ny = size_t(a.batch) * g_.ops[first_].out.numel();
    grow(dy_half_, ny);
    cpu_.round(dy_half_->data(), dy, ny, precision_);
    dp_half_.resize(o.dp.size());
    for (size_t j = 0; j < o.dp.size(); ++j) {
      grow(dp_half_[j], param_numel(j));
      cpu_.fill(dp_half_[j]->data(), param_numel(j), 0.0f);
      o.dp[j] = dp_half_[j]->data();
    }
    ops_[0]->backward(o, dy_half_->data(), dx);
    for (size_t j = 0; j < o.dp.size(); ++j) {
      cpu_.round(dp_half_[j]->data(), dp_half_[j]->data(), param_numel(j), precision_);
      cpu_.add(a.dp[j], dp_half_[j]->data(), param_numel(j));
    }
    if (dx[0]) cpu_.round(dx[0], dx[0], size_t(a.batch) * g_.ops[first_].in.numel(), precision_);
  }
  void grow(std::unique_ptr<Array>& arr, size_t n) {
    if (!arr || arr->size() < n) arr = cpu_.alloc(n);
  }
  // a's pointers cut into each op's, and the inner values' arrays sized.
  void split(const OpArgs& a) {
    args_.assign(ops_.size(), OpArgs{});
    inner_.resize(ops_.size() - 1);
    dinner_.resize(ops_.size() - 1);
    size_t x = 0, p = 0, buf = 0;
    for (size_t k = 0; k < ops_.size(); ++k) {
      const size_t i = first_ + k;
      const Op& op = g_.ops[i];
      OpArgs& o = args_[k];
      o.batch = a.batch;
      o.mode = a.mode;
      for (int v : op.inputs) o.x.push_back(k > 0 && v == int(i) ? inner_[k - 1]->data() : a.x[x++]);
      for (size_t q = 0; q < g_.op_params[i].size(); ++q, ++p) {
        o.p.push_back(a.p[p]);
        o.dp.push_back(a.dp[p]);
      }
      for (size_t q = 0; q < g_.op_buffers[i].size(); ++q) o.buf.push_back(a.buf[buf++]);
      o.counter = g_.op_counter[i] >= 0 ? a.counter : nullptr;
      if (k + 1 == ops_.size()) {
        o.y = a.y;
      } else {
        const size_t n = size_t(a.batch) * size_t(op.out.numel());
        if (!inner_[k] || inner_[k]->size() < n) {
          inner_[k] = cpu_.alloc(n);
          dinner_[k] = cpu_.alloc(n);
        }
        o.y = inner_[k]->data();
      }
    }
  }
  Device& cpu_;
  const Graph& g_;
  size_t first_;
  bool rounds_;
  Precision precision_ = Precision::F32;
  std::vector<std::unique_ptr<Kernel>> ops_;
  std::vector<OpArgs> args_;
  std::vector<std::unique_ptr<Array>> inner_, dinner_, w_half_, dp_half_;
  std::unique_ptr<Array> x_half_, dy_half_;
};

// The CPU device, but for the runs it claims (`claim` says which, from an
// op, and how many ops).
class ClaimingDevice final : public Device {
 public:
  using Claim = std::function<size_t(const Graph&, size_t)>;
  // rounds: its runs make the roundings of a 16-bit precision (RunKernel).
  explicit ClaimingDevice(Claim claim, bool rounds = false)
      : cpu_(make_cpu_device(2)), claim_(std::move(claim)), rounds_(rounds) {}
  std::string name() const override { return "claiming"; }
  std::unique_ptr<Kernel> kernel(const Graph& g, size_t op, StatsReducer* stats) override {
    const size_t n = claim_(g, op);
    if (n > 1) return std::make_unique<RunKernel>(*cpu_, g, op, n, rounds_);
    return cpu_->kernel(g, op, stats);
  }
  std::unique_ptr<Array> alloc(size_t n) override { return cpu_->alloc(n); }
  void fill(float* p, size_t n, float value) override { cpu_->fill(p, n, value); }
  void add(float* dst, const float* src, size_t n) override { cpu_->add(dst, src, n); }
  void scale(float* p, size_t n, float s) override { cpu_->scale(p, n, s); }
  void round(float* dst, const float* src, size_t n, Precision prec) override { cpu_->round(dst, src, n, prec); }
  void to_host(float* host, const float* dev, size_t n) override { cpu_->to_host(host, dev, n); }
  void from_host(float* dev, const float* host, size_t n) override { cpu_->from_host(dev, host, n); }
  void sync() override { cpu_->sync(); }

 private:
  std::unique_ptr<Device> cpu_;
  Claim claim_;
  bool rounds_;
};

// What the GPU claims (bn_act_run); and here also the global pool with its
// flatten.
size_t gpu_like_claim(const Graph& g, size_t i) {
  const bool pool = g.ops[i].kind == OpKind::GlobalAvgPool && i + 1 < g.ops.size() &&
                    g.ops[i + 1].kind == OpKind::Flatten && claimable_run(g, i, 2);
  return bn_act_run(g, i) || pool ? 2 : 1;
}

// And with conv-bn: each convolution with its BatchNorm, and that one's
// ReLU or add.
size_t conv_bn_claim(const Graph& g, size_t i) {
  const size_t conv = conv_bn_run(g, i, true);
  return conv > 1 ? conv : gpu_like_claim(g, i);
}

std::vector<uint32_t> bits(const float* p, size_t n) {
  std::vector<uint32_t> b(n);
  std::memcpy(b.data(), p, n * sizeof(float));
  return b;
}

TEST(ClaimedRuns, ARunIsOnlyOneWhoseInnerValuesNobodyElseReads) {
  const Graph g = test::tiny_resnet();
  size_t bn_relu = 0, bn_add = 0;
  for (size_t i = 0; i + 1 < g.ops.size(); ++i) {
    if (g.ops[i].kind != OpKind::BatchNorm2d) continue;
    const OpKind next = g.ops[i + 1].kind;
    // A projection's convolution may come between a block's last
    // BatchNorm and its add: then there is no run.
    EXPECT_EQ(claimable_run(g, i, 2), next == OpKind::ReLU || next == OpKind::Add)
        << g.ops[i].name << " then " << g.ops[i + 1].name;
    bn_relu += next == OpKind::ReLU;
    bn_add += next == OpKind::Add;
  }
  EXPECT_GT(bn_relu, 0u);
  EXPECT_GT(bn_add, 0u);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    EXPECT_TRUE(claimable_run(g, i, 1));
    // A block's output feeds its successor's convolution and its shortcut.
    if (g.ops[i].kind == OpKind::Add && i + 1 < g.ops.size() && g.last_reader[i + 1] != int(i + 1)) {
      EXPECT_FALSE(claimable_run(g, i, 2)) << g.ops[i].name << "'s output has two readers";
    }
  }
  EXPECT_FALSE(claimable_run(g, g.ops.size() - 1, 2)) << "past the last op";
  EXPECT_FALSE(claimable_run(g, 0, 0));
  // The residual add's outside input is its shortcut.
  for (size_t i = 0; i + 1 < g.ops.size(); ++i)
    if (g.ops[i].kind == OpKind::BatchNorm2d && g.ops[i + 1].kind == OpKind::Add) {
      const std::vector<int> in = run_inputs(g, i, 2);
      ASSERT_EQ(in.size(), 2u);
      EXPECT_EQ(in[0], g.ops[i].inputs[0]);
      EXPECT_EQ(in[1], g.ops[i + 1].inputs[0] == int(i + 1) ? g.ops[i + 1].inputs[1] : g.ops[i + 1].inputs[0]);
    }
}

TEST(ClaimedRuns, TheGpuClaimsResnet18sBatchNormsWithTheirReluOrAdd) {
  const Graph g = model_graph("resnet18", {1, 28, 28}, 10);
  int relu = 0, add = 0;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (bn_act_run(g, i)) {
      relu += g.ops[i + 1].kind == OpKind::ReLU;
      add += g.ops[i + 1].kind == OpKind::Add;
    }
  EXPECT_EQ(relu, 9) << "the stem's and each residual's first";
  EXPECT_EQ(add, 5) << "each residual's second, but where a projection comes between";
  const Graph lenet = model_graph("lenet", {1, 28, 28}, 10);
  for (size_t i = 0; i < lenet.ops.size(); ++i) EXPECT_FALSE(bn_act_run(lenet, i)) << lenet.ops[i].name;
}

// Two training steps of g op by op and on `claiming`, in precision p: the
// logits (train and eval), gradients, buffers, counters and ready prefixes
// bit for bit.
void trains_as_op_by_op(const Graph& g, int batch, ClaimingDevice& claiming, const ClaimingDevice::Claim& claim,
                        Precision p) {
  const int classes = int(g.output_shape().numel());
  ClaimingDevice plain([](const Graph&, size_t) { return size_t(1); });
  Model a(g, plain), b(g, claiming);
  a.set_precision(p);
  b.set_precision(p);
  size_t runs = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) runs += claim(g, i) > 1;
  ASSERT_GT(runs, 2u);
  const ModelState s = init_state(g, 3);
  a.set_state(s);
  b.set_state(s);
  for (int step = 0; step < 2; ++step) {
    const test::Batch in = test::random_batch(batch, 10 + uint64_t(step), int(g.input.numel()), classes);
    std::vector<size_t> ready_a, ready_b;
    std::vector<float> dlogits(size_t(batch) * size_t(classes));
    for (Model* m : {&a, &b}) {
      m->zero_grads();
      const float* logits = m->forward(in.x.data(), batch);
      softmax_cross_entropy(logits, in.y.data(), batch, classes, dlogits.data());
      m->backward(dlogits.data(), batch, [&](size_t n) { (m == &a ? ready_a : ready_b).push_back(n); });
    }
    EXPECT_EQ(bits(b.forward(in.x.data(), batch, Mode::Eval), dlogits.size()),
              bits(a.forward(in.x.data(), batch, Mode::Eval), dlogits.size()));
    EXPECT_EQ(bits(b.grads(), g.num_params), bits(a.grads(), g.num_params));
    ModelState sa, sb;
    a.get_state(sa);
    b.get_state(sb);
    EXPECT_EQ(sb.buffers, sa.buffers);
    EXPECT_EQ(sb.counters, sa.counters);
    EXPECT_LT(ready_b.size(), ready_a.size()) << "a run reports once";
    ASSERT_FALSE(ready_b.empty());
    EXPECT_EQ(ready_b.back(), g.num_params);
    for (size_t k = 1; k < ready_b.size(); ++k) EXPECT_LE(ready_b[k - 1], ready_b[k]);
    for (size_t n : ready_b)
      EXPECT_NE(std::find(ready_a.begin(), ready_a.end(), n), ready_a.end()) << "a prefix op by op reports too";
    for (Model* m : {&a, &b}) {
      float* w = m->params();
      const float* d = m->grads();
      for (size_t k = 0; k < g.num_params; ++k) w[k] -= 0.1f * d[k];
    }
  }
}

TEST(ClaimedRuns, ClaimedRunsTrainBitForBitAsOpByOp) {
  for (const bool resnet18 : {false, true}) {
    const Graph g = resnet18 ? model_graph("resnet18", {1, 28, 28}, 10) : test::tiny_resnet();
    SCOPED_TRACE(g.model);
    ClaimingDevice claiming(gpu_like_claim);
    trains_as_op_by_op(g, resnet18 ? 4 : 6, claiming, gpu_like_claim, Precision::F32);
  }
}

TEST(ClaimedRuns, TheGpuClaimsResnet18sConvolutionsWithTheirBatchNorms) {
  const Graph g = model_graph("resnet18", {1, 28, 28}, 10);
  int runs = 0, relu = 0, add = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    EXPECT_EQ(conv_bn_run(g, i, false), conv_bn_run(g, i, true) > 1 ? 2u : 1u) << g.ops[i].name;
    const size_t n = conv_bn_run(g, i, true);
    if (n == 1) {
      // A projection's convolution feeds the add alone.
      if (g.ops[i].kind == OpKind::Conv2d) {
        EXPECT_NE(g.ops[i + 1].kind, OpKind::BatchNorm2d) << g.ops[i].name;
      }
      continue;
    }
    ++runs;
    EXPECT_TRUE(claimable_run(g, i, n)) << g.ops[i].name;
    EXPECT_EQ(g.ops[i + 1].kind, OpKind::BatchNorm2d);
    if (n == 3) {
      relu += g.ops[i + 2].kind == OpKind::ReLU;
      add += g.ops[i + 2].kind == OpKind::Add;
      EXPECT_TRUE(bn_act_run(g, i + 1));
    } else {
      EXPECT_FALSE(bn_act_run(g, i + 1)) << g.ops[i].name;
    }
  }
  EXPECT_EQ(runs, 17) << "every convolution but the three projections";
  EXPECT_EQ(relu, 9);
  EXPECT_EQ(add, 5);
  const Graph lenet = model_graph("lenet", {1, 28, 28}, 10);
  for (size_t i = 0; i < lenet.ops.size(); ++i) EXPECT_EQ(conv_bn_run(lenet, i, true), 1u) << lenet.ops[i].name;
}

// Note [16-bit handoff]: a run headed by a convolution computes in the
// precision itself, and Model rounds nothing around it; its roundings are
// the ones Model makes op by op.
TEST(ClaimedRuns, ConvolutionRunsInTheirPrecisionTrainBitForBitAsOpByOp) {
  for (const bool resnet18 : {false, true}) {
    const Graph g = resnet18 ? model_graph("resnet18", {1, 28, 28}, 10) : test::tiny_resnet();
    for (const Precision p : {Precision::F32, Precision::BF16, Precision::F16}) {
      SCOPED_TRACE(g.model + " " + to_string(p));
      ClaimingDevice claiming(conv_bn_claim, /*rounds=*/true);
      trains_as_op_by_op(g, resnet18 ? 4 : 6, claiming, conv_bn_claim, p);
    }
  }
}

TEST(ClaimedRuns, AClaimTheGraphDoesNotAllowIsAnError) {
  const Graph g = test::tiny_resnet();
  // The stem's ReLU with the block's first convolution: the ReLU's output is
  // also the first block's shortcut.
  size_t relu = 0;
  while (g.ops[relu].kind != OpKind::ReLU) ++relu;
  ClaimingDevice bad([&](const Graph&, size_t i) { return i == relu ? size_t(2) : size_t(1); });
  try {
    Model m(g, bad);
    FAIL() << "a claim of " << g.ops[relu].name << " and the op after it was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op " + g.ops[relu].name + ": device claiming runs 2 ops from it as one"),
              std::string::npos)
        << e.what();
  }
  // A convolution heads its run (Model rounds only around an op that runs
  // alone)...
  size_t relu1 = 0;
  while (g.ops[relu1].name != "block0.relu1") ++relu1;
  ASSERT_EQ(g.ops[relu1 + 1].kind, OpKind::Conv2d);
  ASSERT_TRUE(claimable_run(g, relu1, 2));
  ClaimingDevice inside([&](const Graph&, size_t i) { return i == relu1 ? size_t(2) : size_t(1); });
  try {
    Model m(g, inside);
    FAIL() << "a run with a convolution inside was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op " + g.ops[relu1 + 1].name +
                                         ": a convolution or linear layer heads the run of ops it is in"),
              std::string::npos)
        << e.what();
  }
  // ...and the run computes in a 16-bit precision itself.
  ClaimingDevice unrounded([](const Graph& gg, size_t i) { return conv_bn_run(gg, i, true); });
  Model m(g, unrounded);
  m.set_precision(Precision::TF32);
  try {
    m.set_precision(Precision::BF16);
    FAIL() << "a convolution's run that does not round was taken in bf16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op stem.conv: the run of 3 ops from it does not compute in bf16 itself"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(m.precision(), Precision::TF32) << "a refused precision changes nothing";
}

}  // namespace
}  // namespace ddp::nn
