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
// bitwise equal at almost no cost); --deterministic takes deterministic ones
// only.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ddp/nn/graph.hpp"      // Shape
#include "ddp/nn/precision.hpp"  // Precision

namespace ddp::nn {

struct ConvAlgoCandidate {
  bool usable = false;
  bool deterministic = false;
};

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
// input, filters, stride, padding, batch and precision ("64x28x28 -> 128 k3
// s2 p1, batch 256, tf32").
inline std::string conv_plan_key(Shape in, int out_c, int k, int stride, int pad, int batch, Precision p) {
  return to_string(in) + " -> " + std::to_string(out_c) + " k" + std::to_string(k) + " s" + std::to_string(stride) +
         " p" + std::to_string(pad) + ", batch " + std::to_string(batch) + ", " + to_string(p);
}

}  // namespace ddp::nn
