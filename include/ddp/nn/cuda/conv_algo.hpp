// ddp::nn::choose_conv_algo: which of cuDNN's ranked convolution algorithms
// the GPU convolution runs (src/nn/cuda/cudnn_conv.cu), as plain host code so the
// rule is checked on machines without a GPU (tests/unit/nn/conv_algo_test.cpp).
//
// Note [conv algorithms]: cuDNN's heuristics (the _v7 queries) rank the
// algorithms for a geometry without running any. We take the first usable one
// (it works, needs at most the workspace cap, and in fp32 is not a tensor-op
// one: Note [fma math] in src/nn/cuda/cudnn_conv.cu) that is also deterministic,
// and only when none is, the first usable one. Several
// backward-data and backward-filter algorithms add with atomics in whatever
// order the blocks finish, so two runs of one step would differ in the last
// bits; deterministic first is what keeps a repeated run, a resumed run and
// an overlapped vs deferred run bitwise equal on a GPU, as on the CPU (Note
// [deterministic sums] in nn/cpu/gemm.hpp).
//
// Note [measured algorithms]: with --cudnn-benchmark the candidates are run
// and timed instead, once per geometry (cudnnFind*AlgorithmEx, as
// torch.backends.cudnn.benchmark does), and the choice is cached by the
// geometry's key (conv_plan_key): a network's repeated layers are timed
// once. The fastest usable one runs, but a deterministic one within
// kDeterministicSlack of it is preferred (repeated and resumed runs then stay
// bitwise equal at almost no cost); a deterministic context takes
// deterministic ones only (ddp_train refuses --cudnn-benchmark with
// --deterministic: timings, and so the choice, differ between runs and
// ranks).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/nn/graph.hpp"      // Shape
#include "ddp/nn/layout.hpp"     // Layout: Note [channels last]
#include "ddp/nn/precision.hpp"  // Precision

namespace ddp::nn {

struct ConvAlgoCandidate {
  bool usable = false;
  bool deterministic = false;
};

// The most workspace a convolution's algorithm or engine may ask for.
constexpr size_t kConvWorkspaceCap = size_t(512) << 20;

struct ConvAlgoChoice {
  int index = -1;              // into the ranked list; -1: none is usable
  bool deterministic = false;  // false: the fallback, a usable but non-deterministic one
};

inline ConvAlgoChoice choose_conv_algo(const std::vector<ConvAlgoCandidate>& ranked) {
  ConvAlgoChoice fallback;
  for (int i = 0; i < int(ranked.size()); ++i) {
    const ConvAlgoCandidate& c = ranked[size_t(i)];
    if (!c.usable) continue;
    if (c.deterministic) return {i, true};
    if (fallback.index < 0) fallback.index = i;
  }
  return fallback;
}

// Note [measured algorithms]: a candidate as it ran (usable: it ran, within
// the workspace cap, on the precision's math) and its time.
struct TimedAlgo {
  bool usable = false;
  bool deterministic = false;
  float ms = 0;
};

// How much slower than the fastest a deterministic algorithm may be and
// still be taken.
constexpr double kDeterministicSlack = 0.05;

struct TimedChoice {
  int index = -1;              // into the timed list; -1: none is usable (or none deterministic, when asked)
  bool deterministic = false;
};

inline TimedChoice choose_timed_algo(const std::vector<TimedAlgo>& timed, bool deterministic_only,
                                     double slack = kDeterministicSlack) {
  int fastest = -1, fastest_det = -1;
  for (int i = 0; i < int(timed.size()); ++i) {
    const TimedAlgo& t = timed[size_t(i)];
    if (!t.usable) continue;
    if (fastest < 0 || t.ms < timed[size_t(fastest)].ms) fastest = i;
    if (t.deterministic && (fastest_det < 0 || t.ms < timed[size_t(fastest_det)].ms)) fastest_det = i;
  }
  if (fastest_det >= 0 && (deterministic_only || timed[size_t(fastest_det)].ms <= (1 + slack) * timed[size_t(fastest)].ms))
    return {fastest_det, true};
  if (deterministic_only || fastest < 0) return {};
  return {fastest, timed[size_t(fastest)].deterministic};
}

// Note [measured algorithms]: what identifies a convolution's timing: its
// input, filters, stride, padding, batch, precision, where it is not NCHW
// layout, and whether only deterministic choices may run ("64x28x28 -> 128
// k3 s2 p1, batch 256, tf32, NHWC, deterministic"): a context's choice made
// without --deterministic is not one a deterministic context may take.
inline std::string conv_plan_key(Shape in, int out_c, int k, int stride, int pad, int batch, Precision p,
                                 Layout layout = Layout::NCHW, bool deterministic = false) {
  return to_string(in) + " -> " + std::to_string(out_c) + " k" + std::to_string(k) + " s" + std::to_string(stride) +
         " p" + std::to_string(pad) + ", batch " + std::to_string(batch) + ", " + to_string(p) +
         (layout == Layout::NCHW ? "" : std::string(", ") + to_string(layout)) +
         (deterministic ? ", deterministic" : "");
}

// Note [graph engines]: with --gpu-kernels proven each direction of a
// convolution (forward, backward data, backward filter) is a one-operation
// graph of cuDNN's graph (backend) API, run by an engine that cuDNN's
// heuristics (mode A, then its fallback list) offer; the legacy API's eight
// algorithms a direction do not include every engine the graph API has
// (PyTorch reaches Hopper's TF32 implicit-GEMM kernels through it). Each
// engine comes with notes, and these rules decide which may run:
// - none that converts its inputs to a narrower type, sums in less than
//   fp32, or compiles a kernel at start-up (seconds per geometry);
// - in strict fp32 none on tensor cores (for fp32 data that means TF32:
//   Note [fma math] in src/nn/cuda/cudnn_conv.cu); in TF32 and 16 bits they
//   are what is wanted;
// - its workspace within the cap;
// - a nondeterministic engine is usable but ranked after deterministic ones
//   (Note [conv algorithms]); --deterministic takes deterministic ones only.
// Every engine a list offers has its notes read before any plan is built
// (in strict fp32 an sm_90 list starts with dozens of tensor-core engines),
// and plans are built for the first 16 whose notes allow them. Engines are
// then chosen as algorithms are: the first usable deterministic one in the
// heuristics' order, or with --cudnn-benchmark the timed choice
// (choose_timed_algo). The fallback list is asked for only where mode A
// offered nothing the run may take (graph_engines_enough); an engine of it
// (made to work, not to be fast) is said once. The weight gradient in fp32
// NCHW is added in place (beta 1) where an engine takes that and a trial
// run shows it adds (cuDNN's frontend never asks for it), else written with
// beta 0 (as the frontend always does) and added. A direction no engine
// may run falls back, said once (with the engines' refusals counted by
// reason: engine_refusals), to the legacy algorithm; so does one whose engine, chosen untimed, fails a trial run on
// zeros when the layer's plan is made.
struct EngineNotes {
  bool tensor_core = false;          // CUDNN_NUMERICAL_NOTE_TENSOR_CORE
  bool down_convert = false;         // CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS
  bool reduced_reduction = false;    // CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION
  bool nondeterministic = false;     // CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC
  bool runtime_compilation = false;  // CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION
};

// Why an engine the heuristics offered may not run: the first rule above
// it fails, or that cuDNN would not read its notes or build its plan, or
// (a run's, not the engine's) that it is not deterministic under
// --deterministic or failed its timing. The message of a direction that
// falls back counts them (engine_refusals).
enum class EngineRefusal {
  kNone,
  kNotesUnread,
  kDownConvert,
  kReducedReduction,
  kRuntimeCompilation,
  kTensorCoreInFp32,
  kNoPlan,
  kWorkspace,
  kNondeterministic,
  kTimingFailed,
};

// The rule of the notes an engine fails first (kNone: the notes allow it).
inline EngineRefusal notes_refusal(const EngineNotes& n, Precision p) {
  if (n.down_convert) return EngineRefusal::kDownConvert;
  if (n.reduced_reduction) return EngineRefusal::kReducedReduction;
  if (n.runtime_compilation) return EngineRefusal::kRuntimeCompilation;
  if (p == Precision::F32 && n.tensor_core) return EngineRefusal::kTensorCoreInFp32;
  return EngineRefusal::kNone;
}

// Whether the notes alone rule an engine out, before its plan is built.
inline bool graph_notes_usable(const EngineNotes& n, Precision p) {
  return notes_refusal(n, p) == EngineRefusal::kNone;
}

inline ConvAlgoCandidate graph_engine_candidate(const EngineNotes& n, Precision p, size_t workspace,
                                                size_t workspace_cap) {
  return {graph_notes_usable(n, p) && workspace <= workspace_cap, !n.nondeterministic};
}

// "3 convert their inputs to a narrower type, 1 is over the workspace
// cap": the refusals counted, in EngineRefusal's order ("" where none).
inline std::string engine_refusals(const std::vector<EngineRefusal>& refusals) {
  static const char* const kWhy[][2] = {
      {"", ""},
      {"has notes cuDNN would not give", "have notes cuDNN would not give"},
      {"converts its inputs to a narrower type", "convert their inputs to a narrower type"},
      {"sums in less than fp32", "sum in less than fp32"},
      {"compiles a kernel at start-up", "compile a kernel at start-up"},
      {"runs on tensor cores (TF32) in strict fp32", "run on tensor cores (TF32) in strict fp32"},
      {"has no plan cuDNN would build", "have no plan cuDNN would build"},
      {"needs more workspace than the cap", "need more workspace than the cap"},
      {"is not deterministic", "are not deterministic"},
      {"failed its timing runs", "failed their timing runs"},
  };
  constexpr size_t kKinds = sizeof(kWhy) / sizeof(kWhy[0]);
  size_t count[kKinds] = {};
  for (EngineRefusal r : refusals)
    if (size_t(r) < kKinds) ++count[size_t(r)];
  std::string out;
  for (size_t k = 1; k < kKinds; ++k)
    if (count[k]) out += (out.empty() ? "" : ", ") + std::to_string(count[k]) + " " + kWhy[k][count[k] > 1];
  return out;
}

// Whether the engines one heuristics mode offered hold one the run may take,
// so that the next mode's list (the fallback's) need not be asked for: a
// usable one, deterministic where only deterministic ones may run.
inline bool graph_engines_enough(const std::vector<ConvAlgoCandidate>& offered, bool deterministic_only) {
  for (const ConvAlgoCandidate& c : offered)
    if (c.usable && (c.deterministic || !deterministic_only)) return true;
  return false;
}

// A graph's tensor: sizes and strides in elements, outermost first (N, C,
// H, W; filters K, C, R, S), as cuDNN's backend tensors take them.
struct GraphTensor {
  std::array<int64_t, 4> dims{}, strides{};
};

inline GraphTensor packed_nchw(int64_t n, int64_t c, int64_t h, int64_t w) {
  return {{n, c, h, w}, {c * h * w, h * w, w, 1}};
}

// The same dimensions laid out channels-last: NHWC, or filters KRSC (Note
// [channels last], nn/layout.hpp).
inline GraphTensor packed_nhwc(int64_t n, int64_t c, int64_t h, int64_t w) {
  return {{n, c, h, w}, {h * w * c, 1, w * c, c}};
}

// A convolution's three tensors in the layout the layers keep (packed NCHW,
// filters [out_c, in_c, k, k], PyTorch's; or NHWC with KRSC filters), the
// same in every direction: backward data writes x's shape, backward filter
// w's.
struct ConvGraphShapes {
  GraphTensor x, w, y;
};

inline ConvGraphShapes conv_graph_shapes(Shape in, Shape out, int k, int batch, Layout layout = Layout::NCHW) {
  const auto packed = layout == Layout::NHWC ? packed_nhwc : packed_nchw;
  return {packed(batch, in.c, in.h, in.w), packed(out.c, in.c, k, k), packed(batch, out.c, out.h, out.w)};
}

// The alignment the graphs promise cuDNN for every operand; an operand
// that is not so aligned runs through the legacy API.
constexpr int64_t kGraphAlignment = 16;

inline bool graph_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kGraphAlignment == 0; }

// Under --deterministic a call of `batch` samples may be one micro-shard of
// a larger buffer, at a multiple of its own size from the buffer's start
// (Note [micro-shards], deterministic/shards.hpp). Where that size (input or
// output, elements of `elem` bytes) is off kGraphAlignment, some
// micro-shards' operands are too and would run the legacy call while the
// others ran the graph: bits that would depend on where a micro-shard sits
// on its rank, and so on the world size. Such a batch size runs the legacy
// call every time.
inline bool graph_slices_aligned(int batch, int64_t in_numel, int64_t out_numel, int64_t elem) {
  return (int64_t(batch) * in_numel * elem) % kGraphAlignment == 0 &&
         (int64_t(batch) * out_numel * elem) % kGraphAlignment == 0;
}

}  // namespace ddp::nn
