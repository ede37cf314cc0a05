// ddp::nn::cpu::gemm: row-major C = alpha * op(A) op(B) + beta * C, one name for
// float and double so the templated CPU ops call one function (cblas_sgemm /
// cblas_dgemm underneath). Every GEMM the CPU layers run goes through here.
//
// Note [OpenBLAS, not our own kernels]: the conv layers once ran hand-written
// AVX-512 GEMM kernels (register-tiled, reading im2col's columns in place).
// Measured on the same chunked im2col engine, OpenBLAS was slower than the
// kernels, by less than their upkeep is worth (measurements:
// bench/RESULTS.md, "OpenBLAS against hand-written GEMM kernels").
// The gap is OpenBLAS copying (packing) both operands of every call, the
// im2col columns included; turning the operands around (dW^T, W^T
// pre-transposed, an im2row layout) measured no better. At that cost the
// project takes the library over ~250 lines of intrinsics. Before bringing
// kernels back for speed, measure against those figures. The one exception
// is --deterministic's micro-shards, which multiply the same weights many
// times a step: there OpenBLAS's packing on every call is what costs, and
// gemm_packed shares one (Note [packed weights] in nn/cpu/packed_gemm.hpp).
#pragma once

#include <cblas.h>

namespace ddp::nn::cpu {

inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Note [serial OpenBLAS]: the ops split a batch over the model's threads
// (ThreadPool) and each thread calls gemm on its own share, so OpenBLAS must
// not thread those calls too: its threads would fight ours for the same cores.
// (Letting OpenBLAS thread each chunk's GEMMs from one thread instead
// measured slower: bench/RESULTS.md, "One OpenBLAS thread per call".)
// OpenBLAS's thread count is global, so a SerialBlas sets it to 1 for its
// lifetime: from the first guard alive (in any thread) to the last, after
// which the count World set
// (set_blas_threads) is back. OpenBLAS's FAQ prescribes exactly this for
// multi-threaded callers, and its pthread build (Debian's
// libopenblas0-pthread) locks its shared buffer pool, so concurrent
// single-threaded calls are safe (tests: gemm_test.cpp, and the ops'
// thread-count tests). Nobody else may set OpenBLAS's count while a guard
// lives.
class SerialBlas {
 public:
  SerialBlas();
  ~SerialBlas();
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;
};

// OpenBLAS's thread count as set outside any SerialBlas (inside one,
// openblas_get_num_threads() says 1).
int blas_threads();

}  // namespace ddp::nn::cpu
