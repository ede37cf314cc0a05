// The GPU convolution's algorithm choice (Note [conv algorithms]): cuDNN's
// ranking is kept, deterministic algorithms come first, and the fallback is
// reported as such.
#include <gtest/gtest.h>

#include "ddp/nn/cuda/conv_algo.hpp"

namespace ddp::nn {
namespace {

constexpr ConvAlgoCandidate kFastAtomic{true, false};
constexpr ConvAlgoCandidate kDeterministic{true, true};
constexpr ConvAlgoCandidate kUnusableDeterministic{false, true};
constexpr ConvAlgoCandidate kUnusable{false, false};

TEST(ConvAlgo, DeterministicBeatsAFasterRankedOne) {
  const ConvAlgoChoice c = choose_conv_algo({kFastAtomic, kFastAtomic, kDeterministic, kDeterministic});
  EXPECT_EQ(c.index, 2);
  EXPECT_TRUE(c.deterministic);
}

TEST(ConvAlgo, RankingDecidesAmongDeterministicOnes) {
  const ConvAlgoChoice c = choose_conv_algo({kDeterministic, kDeterministic});
  EXPECT_EQ(c.index, 0);
  EXPECT_TRUE(c.deterministic);
}

TEST(ConvAlgo, UnusableDeterministicOnesAreNotTaken) {
  const ConvAlgoChoice c = choose_conv_algo({kUnusableDeterministic, kFastAtomic, kUnusable, kFastAtomic});
  EXPECT_EQ(c.index, 1);
  EXPECT_FALSE(c.deterministic);
}

TEST(ConvAlgo, NothingUsable) {
  EXPECT_EQ(choose_conv_algo({kUnusable, kUnusableDeterministic}).index, -1);
  EXPECT_EQ(choose_conv_algo({}).index, -1);
}

// Note [measured algorithms]: the fastest usable one, unless a deterministic
// one is within 5% of it; --deterministic: the fastest deterministic one.
TEST(ConvAlgo, TimedFastestUnlessADeterministicOneIsWithinFivePercent) {
  const TimedAlgo fast_atomic{true, false, 1.00f}, det_close{true, true, 1.04f}, det_slow{true, true, 1.30f},
      det_fastest{true, true, 0.90f}, broken_fastest{false, true, 0.10f};
  TimedChoice c = choose_timed_algo({fast_atomic, det_slow}, false);
  EXPECT_EQ(c.index, 0);
  EXPECT_FALSE(c.deterministic);
  c = choose_timed_algo({det_slow, fast_atomic, det_close}, false);
  EXPECT_EQ(c.index, 2);
  EXPECT_TRUE(c.deterministic);
  c = choose_timed_algo({fast_atomic, det_fastest, broken_fastest}, false);
  EXPECT_EQ(c.index, 1);
  EXPECT_TRUE(c.deterministic);
  // Exactly at the bound is within it; just past it is not.
  EXPECT_EQ(choose_timed_algo({fast_atomic, {true, true, 1.05f}}, false).index, 1);
  EXPECT_EQ(choose_timed_algo({fast_atomic, {true, true, 1.0501f}}, false).index, 0);
}

TEST(ConvAlgo, TimedDeterministicOnlyTakesTheFastestDeterministicOne) {
  const TimedAlgo fast_atomic{true, false, 1.0f}, det_slow{true, true, 3.0f}, det_slower{true, true, 4.0f};
  const TimedChoice c = choose_timed_algo({det_slower, fast_atomic, det_slow}, true);
  EXPECT_EQ(c.index, 2);
  EXPECT_TRUE(c.deterministic);
  EXPECT_EQ(choose_timed_algo({fast_atomic, {false, true, 0.5f}}, true).index, -1) << "none deterministic and usable";
  EXPECT_EQ(choose_timed_algo({{false, false, 1.0f}}, false).index, -1);
  EXPECT_EQ(choose_timed_algo({}, false).index, -1);
}

// The cache's key: the same for the same geometry, another for anything that
// changes the convolution's timing or which choices may run.
TEST(ConvAlgo, PlanKeyNamesEverythingTheTimingDependsOn) {
  const Shape in{64, 28, 28};
  const std::string key = conv_plan_key(in, 128, 3, 2, 1, 256, Precision::TF32);
  EXPECT_EQ(key, "64x28x28 -> 128 k3 s2 p1, batch 256, tf32");
  EXPECT_EQ(conv_plan_key(in, 128, 3, 2, 1, 256, Precision::TF32), key);
  for (const std::string& other :
       {conv_plan_key({64, 28, 27}, 128, 3, 2, 1, 256, Precision::TF32),
        conv_plan_key(in, 64, 3, 2, 1, 256, Precision::TF32), conv_plan_key(in, 128, 1, 2, 1, 256, Precision::TF32),
        conv_plan_key(in, 128, 3, 1, 1, 256, Precision::TF32), conv_plan_key(in, 128, 3, 2, 0, 256, Precision::TF32),
        conv_plan_key(in, 128, 3, 2, 1, 255, Precision::TF32), conv_plan_key(in, 128, 3, 2, 1, 256, Precision::F32),
        conv_plan_key(in, 128, 3, 2, 1, 256, Precision::TF32, Layout::NCHW, /*deterministic=*/true)})
    EXPECT_NE(other, key);
}

// Note [graph engines]: which of cuDNN's graph engines may run, by their
// notes and workspace.
TEST(GraphEngines, StrictFp32RefusesTensorCoresTf32AndHalvesWantThem) {
  EngineNotes tensor_core;
  tensor_core.tensor_core = true;
  EXPECT_FALSE(graph_engine_candidate(tensor_core, Precision::F32, 0, 1).usable) << "TF32 in strict fp32";
  for (Precision p : {Precision::TF32, Precision::BF16, Precision::F16})
    EXPECT_TRUE(graph_engine_candidate(tensor_core, p, 0, 1).usable) << to_string(p);
  for (Precision p : {Precision::F32, Precision::TF32, Precision::BF16, Precision::F16})
    EXPECT_TRUE(graph_engine_candidate(EngineNotes{}, p, 0, 1).usable) << "plain FMA engine, " << to_string(p);
}

TEST(GraphEngines, NarrowerInputsOrSumsAndStartUpCompilationAreNeverTaken) {
  EngineNotes down, reduced, compiled;
  down.down_convert = true;
  reduced.reduced_reduction = true;
  compiled.runtime_compilation = true;
  for (const EngineNotes& n : {down, reduced, compiled})
    for (Precision p : {Precision::F32, Precision::TF32, Precision::BF16, Precision::F16}) {
      EXPECT_FALSE(graph_notes_usable(n, p)) << to_string(p);
      EXPECT_FALSE(graph_engine_candidate(n, p, 0, 1).usable) << to_string(p);
    }
}

// A direction that falls back says why each engine offered was refused,
// counted by reason: the first rule an engine's notes fail.
TEST(GraphEngines, AFallbackCountsWhyTheEnginesWereRefused) {
  EngineNotes down, reduced, compiled, tensor_core, all;
  down.down_convert = true;
  reduced.reduced_reduction = true;
  compiled.runtime_compilation = true;
  tensor_core.tensor_core = true;
  all = {true, true, true, true, true};
  EXPECT_EQ(notes_refusal(down, Precision::BF16), EngineRefusal::kDownConvert);
  EXPECT_EQ(notes_refusal(reduced, Precision::TF32), EngineRefusal::kReducedReduction);
  EXPECT_EQ(notes_refusal(compiled, Precision::F16), EngineRefusal::kRuntimeCompilation);
  EXPECT_EQ(notes_refusal(tensor_core, Precision::F32), EngineRefusal::kTensorCoreInFp32);
  EXPECT_EQ(notes_refusal(tensor_core, Precision::TF32), EngineRefusal::kNone);
  EXPECT_EQ(notes_refusal(all, Precision::F32), EngineRefusal::kDownConvert);
  EXPECT_EQ(notes_refusal(EngineNotes{}, Precision::F32), EngineRefusal::kNone);

  EXPECT_EQ(engine_refusals({}), "");
  EXPECT_EQ(engine_refusals({EngineRefusal::kNone, EngineRefusal::kNone}), "");
  EXPECT_EQ(engine_refusals({EngineRefusal::kWorkspace, EngineRefusal::kDownConvert, EngineRefusal::kNone,
                             EngineRefusal::kDownConvert, EngineRefusal::kTensorCoreInFp32}),
            "2 convert their inputs to a narrower type, 1 runs on tensor cores (TF32) in strict fp32, "
            "1 needs more workspace than the cap");
  EXPECT_EQ(engine_refusals({EngineRefusal::kNondeterministic, EngineRefusal::kTimingFailed,
                             EngineRefusal::kNoPlan, EngineRefusal::kNotesUnread, EngineRefusal::kRuntimeCompilation,
                             EngineRefusal::kReducedReduction, EngineRefusal::kNondeterministic}),
            "1 has notes cuDNN would not give, 1 sums in less than fp32, 1 compiles a kernel at start-up, "
            "1 has no plan cuDNN would build, 2 are not deterministic, 1 failed its timing runs");
}

TEST(GraphEngines, WorkspaceCapAndDeterminism) {
  EngineNotes atomic;
  atomic.nondeterministic = true;
  EXPECT_TRUE(graph_engine_candidate(EngineNotes{}, Precision::TF32, 512, 512).usable);
  EXPECT_FALSE(graph_engine_candidate(EngineNotes{}, Precision::TF32, 513, 512).usable);
  EXPECT_TRUE(graph_engine_candidate(EngineNotes{}, Precision::TF32, 0, 512).deterministic);
  const ConvAlgoCandidate a = graph_engine_candidate(atomic, Precision::TF32, 0, 512);
  EXPECT_TRUE(a.usable);
  EXPECT_FALSE(a.deterministic);
  // Ranked as algorithms are: a deterministic engine after an atomic one is taken.
  EXPECT_EQ(choose_conv_algo({a, graph_engine_candidate(EngineNotes{}, Precision::TF32, 0, 512)}).index, 1);
}

// cuDNN's fallback list is asked for only where the heuristics' first list
// holds nothing the run may take: under --deterministic, a list of usable
// but non-deterministic engines is not enough.
TEST(GraphEngines, FallbackListWhereTheFirstHasNothingTheRunMayTake) {
  const ConvAlgoCandidate atomic{true, false}, exact{true, true}, unusable{false, true};
  EXPECT_TRUE(graph_engines_enough({unusable, atomic}, /*deterministic_only=*/false));
  EXPECT_FALSE(graph_engines_enough({unusable, atomic}, /*deterministic_only=*/true));
  EXPECT_TRUE(graph_engines_enough({atomic, exact}, /*deterministic_only=*/true));
  EXPECT_FALSE(graph_engines_enough({unusable}, /*deterministic_only=*/false));
  EXPECT_FALSE(graph_engines_enough({}, /*deterministic_only=*/false));
}

// The graph's tensors are the layers' own memory: packed NCHW, filters as
// PyTorch keeps them, the same three in every direction.
TEST(GraphEngines, TensorsArePackedNchwAsTheLayersKeepThem) {
  const ConvGraphShapes s = conv_graph_shapes({64, 28, 28}, {128, 14, 14}, 3, 256);
  EXPECT_EQ(s.x.dims, (std::array<int64_t, 4>{256, 64, 28, 28}));
  EXPECT_EQ(s.x.strides, (std::array<int64_t, 4>{64 * 28 * 28, 28 * 28, 28, 1}));
  EXPECT_EQ(s.w.dims, (std::array<int64_t, 4>{128, 64, 3, 3}));
  EXPECT_EQ(s.w.strides, (std::array<int64_t, 4>{64 * 9, 9, 3, 1}));
  EXPECT_EQ(s.y.dims, (std::array<int64_t, 4>{256, 128, 14, 14}));
  EXPECT_EQ(s.y.strides, (std::array<int64_t, 4>{128 * 196, 196, 14, 1}));
}

TEST(GraphEngines, OperandsOffTheAlignmentRunTheLegacyWay) {
  alignas(16) static float buf[8];
  EXPECT_TRUE(graph_aligned(buf));
  EXPECT_TRUE(graph_aligned(buf + 4));
  EXPECT_FALSE(graph_aligned(buf + 1));
  EXPECT_FALSE(graph_aligned(reinterpret_cast<const char*>(buf) + 8));
}

// Under --deterministic: micro-shards of a size that keeps every one of them
// on the alignment (inputs and outputs) may run the graph; any other size
// runs the legacy call for every micro-shard, wherever it sits.
TEST(GraphEngines, MicroShardsOffTheAlignmentRunTheLegacyWayEveryOne) {
  // LeNet's first convolution: 1x28x28 in, 6x28x28 out, fp32.
  EXPECT_TRUE(graph_slices_aligned(16, 28 * 28, 6 * 28 * 28, 4));
  EXPECT_TRUE(graph_slices_aligned(1, 28 * 28, 6 * 28 * 28, 4));  // 784 floats: 3136 bytes
  // 1x5x5 in, 3x5x5 out: 25 and 75 floats a sample.
  EXPECT_FALSE(graph_slices_aligned(3, 25, 75, 4));  // 300 bytes a micro-shard
  EXPECT_FALSE(graph_slices_aligned(2, 25, 75, 4));  // 200
  EXPECT_TRUE(graph_slices_aligned(4, 25, 75, 4));
  EXPECT_FALSE(graph_slices_aligned(4, 24, 75, 2));  // fine in, off out
  EXPECT_FALSE(graph_slices_aligned(4, 25, 24, 2));  // off in, fine out
}

}  // namespace
}  // namespace ddp::nn
