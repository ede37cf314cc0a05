// Which runs of ops the GPU claims (Note [claimed runs], nn/model.hpp), as
// plain host code so the rule is checked on machines without a GPU
// (tests/unit/nn/claimed_runs_test.cpp): a BatchNorm2d and the ReLU or
// residual add right after it, where nobody else reads the BatchNorm's
// output (CudaBatchNormAct, src/nn/cuda/batch_norm.cu). ResNet-18 has 9
// with a ReLU and 5 with an add (its three projection blocks put their
// shortcut's convolution between the BatchNorm and the add).
#pragma once

#include <cstddef>

#include "ddp/nn/graph.hpp"  // Graph, claimable_run

namespace ddp::nn {

inline bool bn_act_run(const Graph& g, size_t i) {
  if (g.ops[i].kind != OpKind::BatchNorm2d || i + 1 >= g.ops.size() || !claimable_run(g, i, 2)) return false;
  const OpKind next = g.ops[i + 1].kind;
  return next == OpKind::ReLU || next == OpKind::Add;
}

}  // namespace ddp::nn
