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
#pragma once

#include <vector>

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

}  // namespace ddp::nn
