// Note [step graphs] (train/step_graphs.hpp): a GPU rank's step is captured
// only after it ran as issued with nothing freed or moved, replayed only for
// its own slot and shape and only while the memory it captured is still
// where it was, and the optimizer's replays take each step's own learning
// rate and step count.
#include "ddp/train/step_graphs.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "../optim/optim_test_util.hpp"
#include "ddp/core/error.hpp"

namespace ddp::train {
namespace {

// Runs one step of `key` through the plan, the step moving the generation
// from `gen` to `gen + allocates`; returns how it ran.
StepRun step(StepGraphPlan& plan, const StepKey& key, uint64_t& gen, bool allocates = false, bool* dropped = nullptr) {
  bool drop = false;
  const StepRun run = plan.decide(key, gen, &drop);
  if (dropped) *dropped = drop;
  const uint64_t before = gen;
  if (allocates && run != StepRun::kReplay) ++gen;
  plan.done(key, run, before, gen);
  return run;
}

int in0, lab0, in1, lab1;  // two pinned slots' buffers
const StepKey kSlot0{&in0, &lab0, 256}, kSlot1{&in1, &lab1, 256};

TEST(StepGraphPlan, AStepIsCapturedAfterTwoCleanStepsAsIssuedThenReplayed) {
  StepGraphPlan plan;
  uint64_t gen = 0;
  // The first step allocates (plans, workspaces): it does not count.
  EXPECT_EQ(step(plan, kSlot0, gen, true), StepRun::kIssue);
  EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kIssue);
  EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kIssue);
  EXPECT_EQ(plan.graphs(), 0u);
  EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kCapture);
  EXPECT_EQ(plan.graphs(), 1u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kReplay);
}

TEST(StepGraphPlan, EachSlotAndShapeHasItsOwnGraph) {
  StepGraphPlan plan;
  uint64_t gen = 0;
  for (int i = 0; i < StepGraphPlan::kWarmup; ++i) {
    EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kIssue);
    EXPECT_EQ(step(plan, kSlot1, gen), StepRun::kIssue) << "slot 1 warms up on its own";
  }
  EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kCapture);
  EXPECT_EQ(step(plan, kSlot1, gen), StepRun::kCapture);
  EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kReplay);
  EXPECT_EQ(step(plan, kSlot1, gen), StepRun::kReplay);
  // The last, partial batch in slot 0's buffers: another shape, never slot
  // 0's graph.
  const StepKey partial{&in0, &lab0, 100};
  EXPECT_EQ(step(plan, partial, gen), StepRun::kIssue);
  EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kReplay);
  EXPECT_EQ(plan.graphs(), 2u);
}

TEST(StepGraphPlan, MemoryFreedOrMovedMakesEveryGraphStaleUntilCapturedAgain) {
  StepGraphPlan plan;
  uint64_t gen = 0;
  for (int i = 0; i < StepGraphPlan::kWarmup; ++i) step(plan, kSlot0, gen);
  ASSERT_EQ(step(plan, kSlot0, gen), StepRun::kCapture);
  ASSERT_EQ(step(plan, kSlot0, gen), StepRun::kReplay);
  ++gen;  // an evaluation's forward grew a workspace
  bool dropped = false;
  EXPECT_EQ(step(plan, kSlot0, gen, false, &dropped), StepRun::kIssue);
  EXPECT_TRUE(dropped);
  EXPECT_EQ(plan.graphs(), 0u);
  EXPECT_EQ(step(plan, kSlot0, gen, false, &dropped), StepRun::kIssue);
  EXPECT_FALSE(dropped);
  EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kCapture);
  EXPECT_EQ(step(plan, kSlot0, gen), StepRun::kReplay);
}

// What the ranks agree on at an epoch's start (Replica::begin_epoch): a
// rank whose evaluation moved memory holds a stale graph, one whose did not
// holds none.
TEST(StepGraphPlan, AGraphIsStaleOnceMemoryMovedSinceItsCapture) {
  StepGraphPlan plan;
  uint64_t gen = 0;
  EXPECT_FALSE(plan.stale(gen)) << "no graph";
  for (int i = 0; i < StepGraphPlan::kWarmup; ++i) step(plan, kSlot0, gen);
  ASSERT_EQ(step(plan, kSlot0, gen), StepRun::kCapture);
  EXPECT_FALSE(plan.stale(gen));
  EXPECT_TRUE(plan.stale(gen + 1));
  ++gen;
  bool dropped = false;
  step(plan, kSlot0, gen, false, &dropped);
  EXPECT_TRUE(dropped);
  EXPECT_FALSE(plan.stale(gen)) << "dropped";
}

TEST(StepGraphPlan, AStepThatAllocatesIsNotCapturedAndACaptureThatDidIsNeverReplayed) {
  StepGraphPlan plan;
  uint64_t gen = 0;
  // Every step allocating: never clean, never captured.
  for (int i = 0; i < 6; ++i) EXPECT_EQ(step(plan, kSlot0, gen, true), StepRun::kIssue);
  step(plan, kSlot0, gen);
  step(plan, kSlot0, gen);
  ASSERT_EQ(step(plan, kSlot0, gen, true), StepRun::kCapture);  // freed something while captured
  bool dropped = false;
  EXPECT_EQ(step(plan, kSlot0, gen, false, &dropped), StepRun::kIssue);
  EXPECT_TRUE(dropped);
}

TEST(StepGraphPlan, NoMoreThanItsGraphsAreKept) {
  StepGraphPlan plan;
  uint64_t gen = 0;
  std::vector<int> xs(StepGraphPlan::kMaxGraphs + 1);
  for (int& x : xs) {
    const StepKey k{&x, &lab0, 64};
    for (int i = 0; i < StepGraphPlan::kWarmup; ++i) step(plan, k, gen);
    const StepRun run = step(plan, k, gen);
    EXPECT_EQ(run, &x == &xs.back() ? StepRun::kIssue : StepRun::kCapture);
  }
  EXPECT_EQ(plan.graphs(), StepGraphPlan::kMaxGraphs);
}

// The optimizer's kernels, each call recorded so that it can be run again
// as a graph's replay runs it: with the arguments it was given.
class RecordingKernels final : public optim::Kernels {
 public:
  explicit RecordingKernels(optim::Kernels& inner) : inner_(inner) {}
  std::vector<std::function<void()>> calls;
  bool recording = false;
  void step(const optim::StepArgs& a) override {
    if (recording) calls.push_back([this, a] { inner_.step(a); });
    inner_.step(a);
  }
  const double* sq_norm(const float* g, size_t n, float unscale, const optim::LossScaleState* ls,
                        const unsigned* skip) override {
    if (recording) calls.push_back([=] { inner_.sq_norm(g, n, unscale, ls, skip); });
    return inner_.sq_norm(g, n, unscale, ls, skip);
  }
  double take_norm_sum() override { return inner_.take_norm_sum(); }
  const unsigned* non_finite(const float* g, size_t n) override { return inner_.non_finite(g, n); }
  const optim::LossScaleState* loss_scale() override { return inner_.loss_scale(); }
  void set_loss_scale(const optim::LossScaleState& s) override { inner_.set_loss_scale(s); }
  void scale_by_loss_scale(float* x, size_t n) override { inner_.scale_by_loss_scale(x, n); }
  void update_loss_scale(const unsigned* f, const optim::ScalerOptions& o) override { inner_.update_loss_scale(f, o); }
  const optim::StepScalars* set_scalars(const optim::StepScalars& s) override { return inner_.set_scalars(s); }

 private:
  optim::Kernels& inner_;
};

void replays_match_steps(const optim::Options& o) {
  const auto shapes = optim::test::tensors({{3, 4}, {4}, {5}});
  const size_t n = 12 + 4 + 5;
  const auto lr = [](int t) { return 0.1 / double(t); };  // a schedule: every step its own
  const auto grads = [n](int t) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = optim::test::grad_at(t, i);
    return g;
  };
  std::vector<float> p_eager(n, 0.5f), p_graph(n, 0.5f);
  optim::test::Rig eager(o, shapes);
  std::unique_ptr<nn::Device> dev = nn::make_cpu_device(1);
  std::unique_ptr<optim::Kernels> cpu = optim::make_cpu_kernels();
  RecordingKernels rec(*cpu);
  optim::Optimizer graphed(o, shapes, *dev, rec);
  // The replays read the gradients where the capture found them.
  std::vector<float> g_graph(n);
  const int kSteps = 7, kCaptureAt = 3;
  for (int t = 1; t <= kSteps; ++t) {
    const std::vector<float> g = grads(t);
    eager.opt->step(lr(t), p_eager.data(), g.data());
    g_graph = g;
    if (t < kCaptureAt) {
      graphed.step(lr(t), p_graph.data(), g_graph.data());
    } else if (t == kCaptureAt) {
      graphed.stage_scalars(lr(t));
      rec.recording = true;
      graphed.step(lr(t), p_graph.data(), g_graph.data());
      rec.recording = false;
      ASSERT_FALSE(rec.calls.empty());
    } else {
      graphed.stage_scalars(lr(t));
      for (const auto& call : rec.calls) call();
      graphed.replayed();
    }
  }
  EXPECT_EQ(graphed.steps(), eager.opt->steps());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(p_graph[i], p_eager[i]) << "parameter " << i;
  optim::State a, b;
  eager.opt->get_state(a);
  graphed.get_state(b);
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t k = 0; k < a.buffers.size(); ++k) EXPECT_EQ(a.buffers[k].second, b.buffers[k].second) << a.buffers[k].first;
  EXPECT_EQ(eager.opt->take_norm_sum(), graphed.take_norm_sum());
}

TEST(StepGraphOptimizer, ReplaysTakeEachStepsLearningRateAndStepCountSgd) {
  optim::Options o;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 0.01;
  replays_match_steps(o);
}

TEST(StepGraphOptimizer, ReplaysTakeEachStepsLearningRateAndStepCountAdamWClipped) {
  optim::Options o;
  o.kind = optim::Kind::AdamW;
  o.weight_decay = 0.05;
  o.no_decay_norm_bias = true;
  o.max_grad_norm = 0.5;
  replays_match_steps(o);
}

TEST(StepGraphOptimizer, AReplayWithoutItsScalarsIsRefused) {
  optim::test::Rig r(optim::Options{}, optim::test::tensors({{4}}));
  EXPECT_THROW(r.opt->replayed(), Error);
}

}  // namespace
}  // namespace ddp::train
