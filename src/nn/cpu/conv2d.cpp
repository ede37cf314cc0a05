// conv2d on the CPU: the chunked im2col + GEMM driver (conv_engine.hpp) with
// the plain epilogue (bias, scatter to NCHW) and source (gather dy from NCHW);
// 3x3 layers with stride 1 and padding 1 take Winograd's algorithm instead
// (nn/cpu/winograd.cpp).
#include <algorithm>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/conv_engine.hpp"
#include "ddp/nn/cpu/ops.hpp"
#include "ddp/nn/cpu/im2col.hpp"
#include "ddp/nn/cpu/packed_gemm.hpp"

namespace ddp::nn::cpu {

void check_conv_geom(const ConvGeom& g) {
  DDP_CHECK(g.batch >= 0 && g.in_c > 0 && g.in_h > 0 && g.in_w > 0 && g.out_c > 0,
            "conv2d: bad shape batch=", g.batch, " in=", g.in_c, "x", g.in_h, "x", g.in_w,
            " out_c=", g.out_c);
  DDP_CHECK(g.k > 0 && g.stride > 0 && g.pad >= 0, "conv2d: bad kernel k=", g.k,
            " stride=", g.stride, " pad=", g.pad);
  DDP_CHECK(g.in_h + 2 * g.pad >= g.k && g.in_w + 2 * g.pad >= g.k, "conv2d: kernel ", g.k,
            " larger than padded input ", g.in_h, "x", g.in_w, " (pad ", g.pad, ")");
}

template <typename T>
void conv2d_forward(const ConvGeom& g, const T* x, const T* w, const T* b, T* y,
                    ConvScratch<T>& s, ThreadPool* pool, const PackedMatrix* packed) {
  if (!packed && winograd_applies(g)) return winograd_conv3x3_forward(g, x, w, b, y, s, pool);
  const int OHW = g.out_h() * g.out_w();
  const int64_t out_img = int64_t(g.out_c) * OHW;
  conv_forward_chunks(g, x, w, s, pool, packed, [&](int n0, int nb, const T* out, int64_t ld) {
    for (int i = 0; i < nb; ++i) {
      T* yi = y + (n0 + i) * out_img;
      for (int oc = 0; oc < g.out_c; ++oc) {
        const T* src = out + int64_t(oc) * ld + int64_t(i) * OHW;
        T* dst = yi + int64_t(oc) * OHW;
        const T bias = b ? b[oc] : T(0);
        for (int p = 0; p < OHW; ++p) dst[p] = src[p] + bias;
      }
    }
  });
}

namespace {

// Images [n0, n0 + nb) of dy (NCHW) as the GEMMs' out_c x (nb OH OW)
// matrix, rows ld apart.
template <typename T>
void gather_dy(const ConvGeom& g, const T* dy, int n0, int nb, T* dyc, int64_t ld) {
  const int OHW = g.out_h() * g.out_w();
  const int64_t out_img = int64_t(g.out_c) * OHW;
  for (int i = 0; i < nb; ++i) {
    const T* dyi = dy + (n0 + i) * out_img;
    for (int oc = 0; oc < g.out_c; ++oc)
      std::copy(dyi + int64_t(oc) * OHW, dyi + int64_t(oc + 1) * OHW, dyc + int64_t(oc) * ld + int64_t(i) * OHW);
  }
}

// im2col's backward, dy gathered from NCHW.
template <typename T>
void im2col_backward(const ConvGeom& g, const T* x, const T* w, const T* dy, T* dw, T* db, T* dx,
                     ConvScratch<T>& s, ThreadPool* pool, const PackedMatrix* packed) {
  conv_backward_chunks(g, x, w, dw, db, dx, s, pool, packed,
                       [&](int n0, int nb, T* dyc, int64_t ld) { gather_dy(g, dy, n0, nb, dyc, ld); });
}

}  // namespace

template <typename T>
void conv2d_backward(const ConvGeom& g, const T* x, const T* w, const T* dy, T* dw, T* db, T* dx,
                     ConvScratch<T>& s, ThreadPool* pool, const PackedMatrix* packed) {
  if (!packed && winograd_applies(g)) return winograd_conv3x3_backward(g, x, w, dy, dw, db, dx, s, pool);
  im2col_backward(g, x, w, dy, dw, db, dx, s, pool, packed);
}

template <typename T>
void conv2d_weight_grad_im2col(const ConvGeom& g, const T* x, const T* dy, T* dw, T* db, ConvScratch<T>& s) {
  DDP_CHECK(dw, "conv2d: a weight gradient without dw");
  im2col_backward<T>(g, x, nullptr, dy, dw, db, nullptr, s, nullptr, nullptr);
}

// The columns (and output gradients) of the micro-shards one pass of
// conv2d_weight_grad_fixed takes: ResNet-18's 512-channel layers, 8
// micro-shards of 8 images, hold 19 MB; more micro-shards take more passes
// over the sums.
constexpr int64_t kFixedRunBytes = int64_t(40) << 20;

void conv2d_weight_grad_fixed(const ConvGeom& g, const float* x, const float* dy, int shard,
                              const fixed_point::Sink& dw, const fixed_point::Sink* db, ConvScratch<float>& s,
                              PackedMatrix& a_scratch) {
  check_conv_geom(g);
  DDP_CHECK(shard > 0 && g.batch % shard == 0, "conv2d: a batch of ", g.batch, " in micro-shards of ", shard);
  const int OHW = g.out_h() * g.out_w(), ckk = g.in_c * g.k * g.k, oc = g.out_c, shards = g.batch / shard;
  const int64_t in_img = int64_t(g.in_c) * g.in_h * g.in_w;
  const int64_t shard_cols = int64_t(shard) * OHW;
  const int per_pass = int(std::clamp<int64_t>(
      kFixedRunBytes / (int64_t(ckk + oc) * shard_cols * int64_t(sizeof(float))), 1, shards));
  if (s.thread.empty()) s.thread.resize(1);
  std::vector<float> db_shard(db ? size_t(oc) : 0);
  for (int s0 = 0; s0 < shards; s0 += per_pass) {
    const int ns = std::min(per_pass, shards - s0), nb = ns * shard, n0 = s0 * shard;
    const int K = int(int64_t(nb) * OHW);
    const int64_t ld = aligned_stride<float>(K);
    reserve_aligned(s.thread[0], size_t(ckk + oc) * size_t(ld));
    float* col = align_up(s.thread[0].data());
    float* dyc = col + int64_t(ckk) * ld;
    ConvGeom run = g;
    run.batch = nb;
    im2col(run, x + n0 * in_img, nb, ld, col);
    gather_dy(g, dy, n0, nb, dyc, ld);
    a_scratch.pack(false, oc, K, dyc, int(ld));
    gemm_packed_fixed(a_scratch, ns, ckk, col, int(ld), /*b_trans=*/true, dw, ckk);
    if (db)
      for (int k = 0; k < ns; ++k) {
        for (int o = 0; o < oc; ++o)
          db_shard[size_t(o)] = row_sum(dyc + int64_t(o) * ld + k * shard_cols, int(shard_cols));
        fixed_point::quantize_add(db_shard.data(), db_shard.size(), *db);
      }
  }
}

template void conv2d_forward<float>(const ConvGeom&, const float*, const float*, const float*,
                                    float*, ConvScratch<float>&, ThreadPool*, const PackedMatrix*);
template void conv2d_forward<double>(const ConvGeom&, const double*, const double*, const double*,
                                     double*, ConvScratch<double>&, ThreadPool*, const PackedMatrix*);
template void conv2d_backward<float>(const ConvGeom&, const float*, const float*, const float*,
                                     float*, float*, float*, ConvScratch<float>&, ThreadPool*, const PackedMatrix*);
template void conv2d_weight_grad_im2col<float>(const ConvGeom&, const float*, const float*, float*, float*,
                                               ConvScratch<float>&);
template void conv2d_weight_grad_im2col<double>(const ConvGeom&, const double*, const double*, double*, double*,
                                                ConvScratch<double>&);
template void conv2d_backward<double>(const ConvGeom&, const double*, const double*,
                                      const double*, double*, double*, double*,
                                      ConvScratch<double>&, ThreadPool*, const PackedMatrix*);

}  // namespace ddp::nn::cpu
