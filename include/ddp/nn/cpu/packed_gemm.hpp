// ddp::nn::cpu::PackedMatrix and gemm_packed: C = A B where A, a layer's
// weights, is packed once and B changes call by call.
//
// Note [packed weights]: --deterministic cuts every batch into micro-shards
// (Note [micro-shards] in deterministic/shards.hpp) and runs each layer once per shard:
// ResNet-18's last block multiplies its 512 x 512 Winograd planes (or
// 512 x 4608 im2col weights) by 32 to 128 columns a shard. OpenBLAS copies
// (packs) the weight operand on every call, so the same weights were packed
// 16 times a step, from memory each time (measurements: bench/RESULTS.md,
// "Packed weights for micro-shards"). Here the micro-shards of one step
// share one packing of the weights, made by LaneKernel::begin_shards, and each
// call packs only its own (small) B.
//
// A is packed into panels of kRows rows: for every k, the panel's kRows
// values of column k side by side, zero past A's last row. gemm_packed walks
// k in blocks of kDepth; within a block each element of C is one register's
// chain of fused multiply-adds from zero, and the blocks' sums are added to C
// in order. Every element of C is therefore the same float whatever n is and
// wherever its column sits among the others: no edge case takes another
// order (tests: packed_gemm_test.cpp). That is what lets a lane take all its
// micro-shards of a convolution in one call (Note [shard runs] in
// deterministic/shards.hpp).
//
// The kernel is AVX-512 (core/simd.hpp); kPackedGemm says whether this build
// has it. Without it callers keep OpenBLAS.
#pragma once

#include <cstddef>
#include <vector>

#include "ddp/core/fixed_point.hpp"  // Sink, Quantizer8
#include "ddp/core/simd.hpp"

namespace ddp::nn {
class ThreadPool;
}

namespace ddp::nn::cpu {

constexpr bool kPackedGemm = DDP_NN_AVX512 != 0;

class PackedMatrix {
 public:
  static constexpr int kRows = 8;    // a panel's rows: the kernel's accumulator rows
  static constexpr int kDepth = 128; // k per block: a block of B's 32 columns is 16 KiB, in L1

  // Packs op(a), an m x k matrix: a is m x k row-major with row stride lda,
  // or, with trans, k x m (op(a) = a^T). Panels split over pool's threads
  // (nullptr: this thread's).
  void pack(bool trans, int m, int k, const float* a, int lda, ThreadPool* pool = nullptr);
  int rows() const { return m_; }
  int depth() const { return k_; }
  // Panel p's values: depth() groups of kRows.
  const float* panel(int p) const { return data_.data() + size_t(p) * size_t(k_) * kRows; }

 private:
  int m_ = 0, k_ = 0;
  std::vector<float> data_;
};

// c (a.rows() x n, row stride ldc) = a b, b a.depth() x n with row stride ldb.
// Overwrites c. Needs kPackedGemm.
void gemm_packed(const PackedMatrix& a, int n, const float* b, int ldb, float* c, int ldc);

// Note [fixed-point epilogue]: --deterministic sums each micro-shard's weight
// gradient, a GEMM over the micro-shard's samples, as fixed-point integers
// (Note [fixed-point gradients] in deterministic/exact_sum.hpp). Computed one
// micro-shard at a time, a 512 x 4608 gradient (ResNet-18's last block) was
// written as floats, read back, converted and added into 19 MB of int64
// sums, and zeroed again, once per micro-shard: memory traffic, not
// arithmetic. Here one call takes a run of micro-shards: the depth splits
// into `segments` equal parts, and each part's product, every element one
// register's chain of fused multiply-adds from zero in blocks of kDepth
// added in order (as gemm_packed does), is converted and added into out's
// integers straight from the registers (fixed_point::Quantizer8: to_fixed's
// arithmetic). Blocks of column strips go outermost, so a block's integers
// stay in cache while every segment adds to them. A segment's integers are
// the same whatever segments sit beside it, and integer sums do not depend
// on their order, so a run gives the bits of its micro-shards one call each.
// Which layers gain is in Conv::shard_grads_to_sinks (nn/cpu/device.cpp).
//
// out.acc[i * ldacc + j] += to_fixed((a_s b_s)[i][j]) for every segment s,
// where a_s is columns [s d, (s + 1) d) of a, b_s rows [s d, (s + 1) d) of b,
// d = a.depth() / segments; b is a.depth() x n with row stride ldb, or with
// b_trans its transpose (b[j * ldb + k]). *out.max takes the largest |a_s
// b_s| element (+infinity for a NaN or an infinity). Needs kFixedPointGemm.
constexpr bool kFixedPointGemm = kPackedGemm && DDP_FIXED_POINT_SIMD != 0;
void gemm_packed_fixed(const PackedMatrix& a, int segments, int n, const float* b, int ldb, bool b_trans,
                       const fixed_point::Sink& out, int64_t ldacc);

}  // namespace ddp::nn::cpu
