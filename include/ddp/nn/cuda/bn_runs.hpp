// Which runs of ops the GPU claims (Note [claimed runs], nn/model.hpp), as
// plain host code so the rule is checked on machines without a GPU
// (tests/unit/nn/claimed_runs_test.cpp): a BatchNorm2d and the ReLU or
// residual add right after it, where nobody else reads the BatchNorm's
// output (CudaBatchNormAct, src/nn/cuda/batch_norm.cu). ResNet-18 has 9
// with a ReLU and 5 with an add (its three projection blocks put their
// shortcut's convolution between the BatchNorm and the add). And a
// convolution with the BatchNorm after it, where nobody else reads the
// convolution's output, with that BatchNorm's run when it has one
// (CudaConvBn, src/nn/cuda/conv_bn.cu; Note [16-bit handoff]): ResNet-18
// has 17, 14 of them with the ReLU or add.
#pragma once

#include <cstddef>

#include "ddp/nn/graph.hpp"  // Graph, claimable_run

namespace ddp::nn {

inline bool bn_act_run(const Graph& g, size_t i) {
  if (g.ops[i].kind != OpKind::BatchNorm2d || i + 1 >= g.ops.size() || !claimable_run(g, i, 2)) return false;
  const OpKind next = g.ops[i + 1].kind;
  return next == OpKind::ReLU || next == OpKind::Add;
}

// The ops a convolution's run from op i takes: 2 (it and its BatchNorm),
// 3 where with_act and the BatchNorm heads a bn_act_run, 1 where op i is
// no convolution with a BatchNorm after it alone reading its output.
inline size_t conv_bn_run(const Graph& g, size_t i, bool with_act) {
  if (g.ops[i].kind != OpKind::Conv2d || i + 1 >= g.ops.size() || g.ops[i + 1].kind != OpKind::BatchNorm2d ||
      !claimable_run(g, i, 2))
    return 1;
  return with_act && bn_act_run(g, i + 1) && claimable_run(g, i, 3) ? 3 : 2;
}

}  // namespace ddp::nn
