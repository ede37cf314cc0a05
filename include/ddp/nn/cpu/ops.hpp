// ddp::nn::cpu: the CPU kernels behind the layers, as free functions templated
// on the element type. float is what the layers run; double is instantiated so
// the tests can check every backward against finite differences without
// rounding noise. These are the reference a GPU twin must agree with.
//
// Layout is PyTorch's: activations NCHW, conv weight [oc, ic, k, k], linear
// weight [out, in]. Every backward ADDS into parameter gradients (Note
// [gradient accumulation] in device.hpp) and OVERWRITES dx; dx may be nullptr.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::nn {
class ThreadPool;
}
namespace ddp::fixed_point {
struct Sink;
}

namespace ddp::nn::cpu {

class PackedMatrix;

// A square-kernel 2-D convolution over a batch.
struct ConvGeom {
  int batch = 1;
  int in_c = 1, in_h = 1, in_w = 1;
  int out_c = 1;
  int k = 1, stride = 1, pad = 0;
  int out_h() const { return (in_h + 2 * pad - k) / stride + 1; }
  int out_w() const { return (in_w + 2 * pad - k) / stride + 1; }
};

// Throws ddp::Error when the geometry is empty or the kernel does not fit.
void check_conv_geom(const ConvGeom& g);

// What a conv layer keeps between calls so that a training step allocates
// nothing: per-thread buffers (they grow on first use).
template <typename T>
struct ConvScratch {
  std::vector<std::vector<T>> thread;  // per thread: im2col columns + GEMM output
  std::vector<std::vector<T>> grad;    // per thread but the first: partial dW | db
  std::vector<T> winograd_weights;     // the kernels transformed (Note [winograd])
};

// conv2d over a batch, split over pool's threads by image (nullptr: the
// calling thread alone). im2col + GEMM per chunk of images (Note [conv chunks]
// in conv_engine.hpp), or Winograd's algorithm where it applies (below).
// packed: im2col's path whatever winograd_applies says, with the weights
// packed beforehand (Note [packed weights] in nn/cpu/packed_gemm.hpp; float only):
// w (out_c x in_c*k*k) for forward, w^T for backward's input gradient;
// nullptr: OpenBLAS packs them. backward adds into dw and db (nullptr:
// none; db only with dw), overwrites dx (nullptr: not wanted).
template <typename T>
void conv2d_forward(const ConvGeom& g, const T* x, const T* w, const T* b, T* y,
                    ConvScratch<T>& s, ThreadPool* pool = nullptr, const PackedMatrix* packed = nullptr);
template <typename T>
void conv2d_backward(const ConvGeom& g, const T* x, const T* w, const T* dy, T* dw, T* db, T* dx,
                     ConvScratch<T>& s, ThreadPool* pool = nullptr, const PackedMatrix* packed = nullptr);
// Only conv2d_backward's weight and bias gradients (db may be nullptr), by
// im2col's path whatever winograd_applies says, on the calling thread.
template <typename T>
void conv2d_weight_grad_im2col(const ConvGeom& g, const T* x, const T* dy, T* dw, T* db, ConvScratch<T>& s);
// Note [fixed-point epilogue] (nn/cpu/packed_gemm.hpp): each micro-shard's weight
// and bias gradients, g.batch / shard of them, on im2col's path, converted
// and added into dw's and db's fixed-point sums (db may be nullptr), on the
// calling thread; a_scratch keeps the packed output gradients between calls.
// Needs kFixedPointGemm.
void conv2d_weight_grad_fixed(const ConvGeom& g, const float* x, const float* dy, int shard,
                              const fixed_point::Sink& dw, const fixed_point::Sink* db, ConvScratch<float>& s,
                              PackedMatrix& a_scratch);

// 3x3 convolutions with stride 1 and padding 1 by Winograd's F(2x2, 3x3) or
// F(4x4, 3x3) (Note [winograd] in nn/cpu/winograd.cpp): conv2d_forward and
// conv2d_backward take this path for the layers where winograd_applies (the
// geometry fits and the batch has enough tiles to repay the weights'
// transforms), with winograd_tile's tile size; im2col's otherwise. tile: 2 or
// 4 outputs a side, 0 for winograd_tile's.
bool winograd_fits(const ConvGeom& g);
bool winograd_applies(const ConvGeom& g);
// Where micro-shards of g.batch samples that share one transform of the
// kernels (winograd_transform_weights) take Winograd's path: from fewer
// tiles than winograd_applies, and wherever it does.
bool winograd_applies_to_shards(const ConvGeom& g);
// u: the kernels transformed beforehand (winograd_transform_weights), or
// nullptr; packed: u's (tile + 2)^2 planes packed (pack_winograd_planes),
// or nullptr.
template <typename T>
void winograd_conv3x3_forward(const ConvGeom& g, const T* x, const T* w, const T* b, T* y, ConvScratch<T>& s,
                              ThreadPool* pool = nullptr, int tile = 0, const T* u = nullptr,
                              const PackedMatrix* packed = nullptr);
// As conv2d_backward: adds into dw and db (nullptr: none; db only with dw),
// overwrites dx (nullptr: not wanted).
template <typename T>
void winograd_conv3x3_backward(const ConvGeom& g, const T* x, const T* w, const T* dy, T* dw, T* db, T* dx,
                               ConvScratch<T>& s, ThreadPool* pool = nullptr, int tile = 0, const T* u = nullptr,
                               const PackedMatrix* packed = nullptr);
// w's kernels as the two calls above transform them for `tile` (turned, for
// backward's input gradient, with `turned`), into u: callers that run one
// layer's weights over many small batches (micro-shards) pass u to each
// call in place of transforming again.
template <typename T>
void winograd_transform_weights(const ConvGeom& g, const T* w, bool turned, int tile, std::vector<T>& u,
                                ThreadPool* pool = nullptr);
// u's planes (as winograd_transform_weights made them for g, turned or not)
// packed for gemm_packed, one PackedMatrix a plane (Note [packed weights]).
void pack_winograd_planes(const ConvGeom& g, bool turned, int tile, const std::vector<float>& u,
                          std::vector<PackedMatrix>& planes, ThreadPool* pool = nullptr);
// The tile size conv2d takes for g: 4 from enough tiles, 2 below.
int winograd_tile(const ConvGeom& g);
// Whether micro-shards of g.batch samples on Winograd's path
// (winograd_applies_to_shards) take their weight gradients by im2col's
// path instead (conv2d_weight_grad_im2col): where Winograd's GEMMs would be
// too shallow to repay writing and transforming back their N^2 planes.
bool shard_weight_grad_by_im2col(const ConvGeom& g);

// conv2d -> ReLU -> 2x2 average pooling (stride 2, floor), fused: the conv
// output never leaves cache; what backward needs of it is one bit per element
// (was it positive), kept in relu_mask (conv_relu_mask_bytes(g) bytes, image
// after image). y is [batch, out_c, out_h/2, out_w/2]; dy of the same shape.
template <typename T>
void conv2d_relu_avgpool2_forward(const ConvGeom& g, const T* x, const T* w, const T* b, T* y,
                                  uint8_t* relu_mask, ConvScratch<T>& s, ThreadPool* pool = nullptr);
template <typename T>
void conv2d_relu_avgpool2_backward(const ConvGeom& g, const T* x, const T* w, const uint8_t* relu_mask,
                                   const T* dy, T* dw, T* db, T* dx, ConvScratch<T>& s,
                                   ThreadPool* pool = nullptr);

// Bytes of relu mask per conv output row that pooling reads (bit j of byte b
// is column 8b + j), and in all for a batch.
int64_t conv_relu_mask_row_bytes(const ConvGeom& g);
int64_t conv_relu_mask_bytes(const ConvGeom& g);

// 2x2 average pooling, stride 2; odd trailing rows/columns are dropped
// (floor), as nn.AvgPool2d(2) does. planes = batch * channels.
template <typename T>
void avgpool2_forward(int planes, int h, int w, const T* x, T* y);
template <typename T>
void avgpool2_backward(int planes, int h, int w, const T* dy, T* dx);

template <typename T>
void relu_forward(int64_t n, const T* x, T* y);
// Uses the output y (y > 0 exactly where x > 0), so x need not be kept.
template <typename T>
void relu_backward(int64_t n, const T* y, const T* dy, T* dx);

// y[b, out] = x[b, in] W^T + bias, W stored [out, in]; rows shared over
// pool's threads like the convolutions' chunks.
template <typename T>
void linear_forward(int batch, int in, int out, const T* x, const T* w, const T* b, T* y,
                    ThreadPool* pool = nullptr);

// Adds into dW and db, overwrites dx (skipped when nullptr); columns of `in`
// shared over pool's threads.
template <typename T>
void linear_backward(int batch, int in, int out, const T* x, const T* w, const T* dy, T* dw, T* db,
                     T* dx, ThreadPool* pool = nullptr);

// BatchNorm2d over NCHW (hw = h*w), in steps a synchronised BatchNorm can
// all-reduce between: per channel c, over the batch's n = batch * hw values.
// Sums are in double, each channel's in a fixed order (channels are shared
// over pool's threads), so results do not depend on the threads.
//   forward (train): mean = bn_sum / n; var = bn_sum_sq_dev / n (biased);
//                    invstd = 1/sqrt(var + eps); y = bn_apply(scale = w*invstd,
//                    shift = b - mean*scale), as PyTorch's CPU kernel.
//   backward:        bn_grad_sums gives sum(dy) and sum(dy*(x - mean));
//                    dw += sum(dy*(x - mean))*invstd, db += sum(dy);
//                    dx = bn_backward_apply(...).
template <typename T>
void bn_sum(int batch, int c, int hw, const T* x, double* sum, ThreadPool* pool = nullptr);
template <typename T>
void bn_sum_sq_dev(int batch, int c, int hw, const T* x, const T* mean, double* sq, ThreadPool* pool = nullptr);
template <typename T>
void bn_apply(int batch, int c, int hw, const T* x, const T* scale, const T* shift, T* y, ThreadPool* pool = nullptr);
template <typename T>
void bn_grad_sums(int batch, int c, int hw, const T* x, const T* mean, const T* dy, double* sum_dy,
                  double* sum_dy_xmu, ThreadPool* pool = nullptr);
// dx = w*invstd * (dy - sum_dy/count - (x - mean)*invstd^2*sum_dy_xmu/count),
// count being the number of values the statistics were taken over (all
// ranks' with a synchronised BatchNorm).
template <typename T>
void bn_backward_apply(int batch, int c, int hw, const T* x, const T* mean, const T* invstd, const T* w,
                       const T* dy, const double* sum_dy, const double* sum_dy_xmu, double count, T* dx,
                       ThreadPool* pool = nullptr);

// y = a + b, then max(y, 0) when relu; backward writes the same gradient to
// da and db (either may be nullptr).
template <typename T>
void add_forward(int64_t n, const T* a, const T* b, bool relu, T* y);
template <typename T>
void add_backward(int64_t n, const T* y, bool relu, const T* dy, T* da, T* db);

// AdaptiveAvgPool2d(1): y[p] = mean of plane p's hw values (in order).
template <typename T>
void global_avgpool_forward(int64_t planes, int hw, const T* x, T* y);
template <typename T>
void global_avgpool_backward(int64_t planes, int hw, const T* dy, T* dx);

// Mean softmax cross-entropy over the batch (max-shifted, so large logits do
// not overflow); writes d(mean loss)/d(logits) when dlogits is not nullptr,
// the mean taken over grad_batch samples where it is > 0 (one micro-batch of
// an accumulated step: its share of the step's mean). Throws ddp::Error for a
// label outside [0, classes).
template <typename T>
T softmax_cross_entropy(const T* logits, const int32_t* labels, int batch, int classes,
                        T* dlogits, int grad_batch = 0);

}  // namespace ddp::nn::cpu
