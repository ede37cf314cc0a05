// BatchNorm2d on the GPU, in the steps of the CPU's (nn/cpu/ops.hpp): per channel
// a block sums its plane of every image in double (with --gpu-kernels proven,
// several blocks a channel sum runs of its values and a second pass adds the
// runs in order: Note [batch norm sums], nn/cuda/bn_plan.hpp; fixed trees
// either way, so results repeat bit for bit), one thread a channel turns the sums into the
// constants (kernel_math.hpp's bn_*_channel, the CPU's very formulas), and an
// element-wise pass applies them. With a StatsReducer the sums go to the
// host, are summed over ranks (SyncBatchNorm), and come back; with
// --gpu-kernels proven the device communicator sums them on the device, the
// host not waiting (NCCL's all-reduce on the GPU), and one rank's not at
// all. The deterministic mode takes the sums micro-shard by micro-shard
// (CudaBatchNorm::channel_sums, deterministic/; with --gpu-kernels proven all
// micro-shards in one launch: Note [shards in one launch], bn_plan.hpp).
// With --gpu-kernels proven a BatchNorm also runs the ReLU or residual add
// after it (CudaBatchNormAct, Note [claimed runs] in nn/model.hpp): one pass
// forward and one backward where there were two or three, the same bits.
// NHWC batches (Note
// [channels last], nn/layout.hpp) are summed as Note [channels last sums]
// says, and the element-wise passes find a value's channel as i % c.
#include <cuda_runtime_api.h>

#include <string>

#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/bn_plan.hpp"     // plan_bn_split: Note [batch norm sums]
#include "ddp/nn/cuda/bn_runs.hpp"     // bn_act_run: Note [claimed runs]
#include "ddp/core/error.hpp"          // DDP_CHECK
#include "ddp/nn/kernel_math.hpp"      // bn_*
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK, DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

constexpr int kThreads = 256;  // a power of two: the block sum halves it

// The split sums' launches: channels (NCHW) and micro-shards are grid
// dimensions (at most 65535 each), and 2 sums a channel a micro-shard are
// indexed in int.
void check_sum_grid(const std::string& who, int c, int shards) {
  DDP_CHECK(c <= 65535 && shards <= 65535 && int64_t(2) * c * shards < (int64_t(1) << 31), who, ": ", c,
            " channels and ", shards, " micro-shards in one launch; at most 65535 of each are supported");
}

// Block sums of (a, b) into s_a[0], s_b[0] (kThreads entries each).
__device__ void block_sum2(double* sa, double* sb, double a, double b) {
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sa[threadIdx.x] += sa[threadIdx.x + half];
      sb[threadIdx.x] += sb[threadIdx.x + half];
    }
    __syncthreads();
  }
}

// What a thread reads: value k (of channel ch) of a tensor as a float (at)
// or a double (fp32, or 16-bit values: the gradients of Note [half
// kernels], a convolution's output handed over in 16 bits, Note [16-bit
// handoff] in conv_bn.cu, with its bias added as it is read).
struct FloatValues {
  const float* p;
  __device__ float at(int64_t k, int) const { return __ldg(p + k); }
  __device__ double operator()(int64_t k, int ch) const { return double(at(k, ch)); }
};
struct HalfValues {
  const uint16_t* p;
  Precision prec;
  const float* bias = nullptr;  // per channel; added as plane_from_half_at adds it
  __device__ float at(int64_t k, int ch) const {
    const float v = half_bits_to_float(prec, __ldg(p + k));
    return bias ? half_plus_bias(prec, v, __ldg(bias + ch)) : v;
  }
  __device__ double operator()(int64_t k, int ch) const { return double(at(k, ch)); }
};
// And where it writes an input gradient: floats, or 16-bit values (their
// rounding, Note [16-bit handoff]); p nullptr: nowhere. put returns the
// value written, as FloatValues or HalfValues would read it back.
struct FloatOut {
  float* p;
  __device__ float put(int64_t k, float v) const {
    p[k] = v;
    return v;
  }
};
struct HalfOut {
  uint16_t* p;
  Precision prec;
  __device__ float put(int64_t k, float v) const {
    const uint16_t h = to_half_bits(prec, v);
    p[k] = h;
    return half_bits_to_float(prec, h);
  }
};

// --gpu-kernels reference: block ch: out[ch] = sum of x over the channel's values; with mean, the sum
// of (x - mean[ch])^2 instead.
template <typename Values>
__global__ void __launch_bounds__(kThreads)
    bn_sums_kernel(int batch, int c, int hw, Values x, const float* __restrict__ mean, double* __restrict__ out) {
  __shared__ double sa[kThreads], sb[kThreads];
  const int ch = blockIdx.x;
  const double m = mean ? double(mean[ch]) : 0.0;
  const int64_t n = int64_t(batch) * hw;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const double v = x((j / hw * c + ch) * hw + j % hw, ch);
    s += mean ? (v - m) * (v - m) : v;
  }
  block_sum2(sa, sb, s, 0.0);
  if (threadIdx.x == 0) out[ch] = sa[0];
}

// The gradient that reaches the BatchNorm: dy, or where a ReLU follows it in
// a claimed run (Note [claimed runs]) dy where the run's output y > 0.
__device__ __forceinline__ float bn_dy(const float* dy, const float* relu_y, int64_t k) {
  return relu_y ? kernel::relu_grad_at(relu_y[k], dy[k]) : dy[k];
}

// Note [batch norm sums]'s runs over NCHW: the index of a run's value j of
// channel ch (pixel j % hw of image j / hw). In 32 bits: each launch checks
// that a channel has under 2^31 values.
__device__ __forceinline__ int64_t nchw_run_index(int64_t j, int ch, int c, int hw) {
  const unsigned image = unsigned(j) / unsigned(hw);
  return (int64_t(image) * c + ch) * hw + (j - int64_t(image) * hw);
}

// Note [channels last sums]: each thread's sum s of its channel's rows (ch,
// a block's lanes kNhwcGroup channels), the block's warps' sums added in
// warp order into *out where ch < c. sa: kThreads doubles of shared memory.
__device__ __forceinline__ void nhwc_warps_sum(double* sa, double s, int ch, int c, double* out) {
  static_assert(kThreads == kNhwcGroup * kNhwcWarps, "a block is kNhwcWarps warps");
  const int lane = threadIdx.x % kNhwcGroup, warp = threadIdx.x / kNhwcGroup;
  sa[threadIdx.x] = s;
  __syncthreads();
  if (warp == 0 && ch < c) {
    double t = 0.0;
    for (int w = 0; w < kNhwcWarps; ++w) t += sa[w * kNhwcGroup + lane];
    *out = t;
  }
}

// Block ch: out[ch] = sum(dy), out[c + ch] = sum(dy * (x - mean)).
template <typename Values>
__global__ void __launch_bounds__(kThreads)
    bn_grad_sums_kernel(int batch, int c, int hw, Values x, const float* __restrict__ mean,
                        const float* __restrict__ dy, const float* __restrict__ relu_y, double* __restrict__ out) {
  __shared__ double sa[kThreads], sb[kThreads];
  const int ch = blockIdx.x;
  const double m = double(mean[ch]);
  const int64_t n = int64_t(batch) * hw;
  double s = 0.0, sx = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const int64_t k = (j / hw * c + ch) * hw + j % hw;
    const double g = double(bn_dy(dy, relu_y, k));
    s += g;
    sx += g * (x(k, ch) - m);
  }
  block_sum2(sa, sb, s, sx);
  if (threadIdx.x == 0) {
    out[ch] = sa[0];
    out[c + ch] = sb[0];
  }
}

// --gpu-kernels proven: block (run, ch) of Note [batch norm sums]: sums run `run` of channel ch's
// values (value j is pixel j % hw of image j / hw) into part[ch * runs + run]:
// of x; with mean, of (x - mean[ch])^2 instead.
template <typename Values>
__global__ void __launch_bounds__(kThreads)
    bn_run_sums_kernel(int64_t values, int64_t per_split, int c, int hw, int64_t shard_elems, Values x,
                       const float* __restrict__ mean, double* __restrict__ part) {
  __shared__ double sa[kThreads], sb[kThreads];
  const int run = blockIdx.x, runs = gridDim.x, ch = blockIdx.y;
  // Note [shards in one launch]: block z sums micro-shard z as a launch of
  // its own would.
  x.p += blockIdx.z * shard_elems;
  part += int64_t(blockIdx.z) * c * runs;
  const double m = mean ? double(mean[ch]) : 0.0;
  const int64_t end = min(values, (run + 1) * per_split);
  double s = 0.0;
  for (int64_t j = run * per_split + threadIdx.x; j < end; j += kThreads) {
    const double v = x(nchw_run_index(j, ch, c, hw), ch);
    s += mean ? (v - m) * (v - m) : v;
  }
  block_sum2(sa, sb, s, 0.0);
  if (threadIdx.x == 0) part[int64_t(ch) * runs + run] = sa[0];
}

// Block (run, ch): part[ch * runs + run] = its run's sum(dy), and
// part[(c + ch) * runs + run] = its sum(dy * (x - mean)).
template <typename Values>
__global__ void __launch_bounds__(kThreads)
    bn_run_grad_sums_kernel(int64_t values, int64_t per_split, int c, int hw, int64_t shard_elems, Values x,
                            const float* __restrict__ mean, const float* __restrict__ dy,
                            const float* __restrict__ relu_y, double* __restrict__ part) {
  __shared__ double sa[kThreads], sb[kThreads];
  const int run = blockIdx.x, runs = gridDim.x, ch = blockIdx.y;
  x.p += blockIdx.z * shard_elems;
  dy += blockIdx.z * shard_elems;
  if (relu_y) relu_y += blockIdx.z * shard_elems;
  part += int64_t(blockIdx.z) * 2 * c * runs;
  const double m = double(mean[ch]);
  const int64_t end = min(values, (run + 1) * per_split);
  double s = 0.0, sx = 0.0;
  for (int64_t j = run * per_split + threadIdx.x; j < end; j += kThreads) {
    const int64_t k = nchw_run_index(j, ch, c, hw);
    const double g = double(bn_dy(dy, relu_y, k));
    s += g;
    sx += g * (x(k, ch) - m);
  }
  block_sum2(sa, sb, s, sx);
  if (threadIdx.x == 0) {
    part[int64_t(ch) * runs + run] = sa[0];
    part[int64_t(c + ch) * runs + run] = sb[0];
  }
}

// Note [channels last sums] (nn/cuda/bn_plan.hpp), over an NHWC tensor of
// `rows` rows of c channels.
// Block (run, group): channels group * kNhwcGroup on, rows run * per_split
// on; part[ch * runs + run] = the run's sum of channel ch (with mean: of
// (x - mean[ch])^2).
template <typename Values>
__global__ void __launch_bounds__(kThreads)
    nhwc_run_sums_kernel(int64_t rows, int64_t per_split, int c, Values x, const float* __restrict__ mean,
                         double* __restrict__ part) {
  __shared__ double sa[kThreads];
  const int run = blockIdx.x, runs = gridDim.x, warp = threadIdx.x / kNhwcGroup;
  x.p += blockIdx.z * rows * c;  // Note [shards in one launch]
  part += int64_t(blockIdx.z) * c * runs;
  const int ch = blockIdx.y * kNhwcGroup + threadIdx.x % kNhwcGroup;
  const int64_t end = min(rows, (run + 1) * per_split);
  double s = 0.0;
  if (ch < c) {
    const double m = mean ? double(mean[ch]) : 0.0;
    for (int64_t r = run * per_split + warp; r < end; r += kNhwcWarps) {
      const double v = x(r * c + ch, ch);
      s += mean ? (v - m) * (v - m) : v;
    }
  }
  nhwc_warps_sum(sa, s, ch, c, part + int64_t(ch) * runs + run);
}

// The same for backward: part[ch * runs + run] = the run's sum(dy), part[(c +
// ch) * runs + run] = its sum(dy * (x - mean)).
template <typename Values>
__global__ void __launch_bounds__(kThreads)
    nhwc_run_grad_sums_kernel(int64_t rows, int64_t per_split, int c, Values x, const float* __restrict__ mean,
                              const float* __restrict__ dy, const float* __restrict__ relu_y,
                              double* __restrict__ part) {
  __shared__ double sa[kThreads], sb[kThreads];
  const int run = blockIdx.x, runs = gridDim.x, warp = threadIdx.x / kNhwcGroup;
  const int64_t shard_elems = rows * c;  // Note [shards in one launch]
  x.p += blockIdx.z * shard_elems;
  dy += blockIdx.z * shard_elems;
  if (relu_y) relu_y += blockIdx.z * shard_elems;
  part += int64_t(blockIdx.z) * 2 * c * runs;
  const int ch = blockIdx.y * kNhwcGroup + threadIdx.x % kNhwcGroup;
  const int64_t end = min(rows, (run + 1) * per_split);
  double s = 0.0, sx = 0.0;
  if (ch < c) {
    const double m = double(mean[ch]);
    for (int64_t r = run * per_split + warp; r < end; r += kNhwcWarps) {
      const int64_t k = r * c + ch;
      const double g = double(bn_dy(dy, relu_y, k));
      s += g;
      sx += g * (x(k, ch) - m);
    }
  }
  nhwc_warps_sum(sa, s, ch, c, part + int64_t(ch) * runs + run);
  nhwc_warps_sum(sb, sx, ch, c, part + int64_t(c + ch) * runs + run);
}

// out[i] = the sum of row i's runs, in run order (rows: width of them).
__global__ void bn_runs_kernel(int width, int runs, const double* __restrict__ part, double* __restrict__ out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
    double s = 0.0;
    for (int r = 0; r < runs; ++r) s += part[int64_t(i) * runs + r];
    out[i] = s;
  }
}

// The same a warp a row (warp-run-sums, Note [batch norm sums]): lane l
// adds runs l, l + 32, ... in order, reading a row's runs 32 at a time, and
// the lanes' sums are added in a fixed tree. Every lane of a warp takes the
// same rows, so the shuffles see all 32.
__global__ void bn_runs_warp_kernel(int width, int runs, const double* __restrict__ part, double* __restrict__ out) {
  const int lane = int(threadIdx.x % 32);
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; i < width; i += warps) {
    double s = 0.0;
    for (int r = lane; r < runs; r += 32) s += part[i * runs + r];
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) out[i] = s;
  }
}

// The split sums' second pass: out[i] for each of width rows from its runs'
// sums in parts.
void add_runs(const cuda::Context& ctx, int64_t width, int runs, const double* parts, double* out, cudaStream_t s) {
  if (ctx.next(NextKernel::WarpRunSums)) {
    bn_runs_warp_kernel<<<cuda_grid(width * 32), kCudaThreads, 0, s>>>(int(width), runs, parts, out);
    DDP_CUDA_CHECK_LAUNCH(bn_runs_warp_kernel);
  } else {
    bn_runs_kernel<<<cuda_grid(width), kCudaThreads, 0, s>>>(int(width), runs, parts, out);
    DDP_CUDA_CHECK_LAUNCH(bn_runs_kernel);
  }
}

// The per-channel constants, one thread a channel. chan: mean, invstd,
// scale, shift, k, mean_dy, proj (c floats each).
__global__ void bn_mean_kernel(int c, const double* __restrict__ sums, double count, float* __restrict__ chan) {
  for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x)
    chan[ch] = kernel::bn_mean(sums[ch], count);
}

__global__ void bn_train_kernel(int c, const double* __restrict__ sq, double count, double eps, double momentum,
                                const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ chan,
                                float* __restrict__ running_mean, float* __restrict__ running_var) {
  for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x)
    kernel::bn_train_channel(sq[ch], count, eps, momentum, chan[ch], w[ch], b[ch], &chan[c + ch], &chan[2 * c + ch],
                             &chan[3 * c + ch], &running_mean[ch], &running_var[ch]);
}

__global__ void bn_eval_kernel(int c, double eps, const float* __restrict__ w, const float* __restrict__ b,
                               const float* __restrict__ running_mean, const float* __restrict__ running_var,
                               float* __restrict__ chan) {
  for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x)
    kernel::bn_eval_channel(w[ch], b[ch], running_mean[ch], running_var[ch], eps, &chan[2 * c + ch],
                            &chan[3 * c + ch]);
}

// Adds this rank's weight and bias gradients (as the CPU: from its own sums).
__global__ void bn_param_grads_kernel(int c, const double* __restrict__ sums, const float* __restrict__ chan,
                                      float* __restrict__ dw, float* __restrict__ db) {
  for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x) {
    dw[ch] += float(sums[c + ch] * double(chan[c + ch]));
    db[ch] += float(sums[ch]);
  }
}

// Note [shard gradients together]: micro-shard k's weight and bias
// gradients from its sums (2c a micro-shard) into out[k * 2c ..], as
// bn_param_grads_kernel adds them into zeroed gradients (0 + x: the same
// bits, a negative zero's sign included).
__global__ void bn_param_grads_shards_kernel(int c, int shards, const double* __restrict__ sums,
                                             const float* __restrict__ chan, float* __restrict__ out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < c * shards; i += gridDim.x * blockDim.x) {
    const int k = i / c, ch = i - k * c;
    const double* s = sums + int64_t(k) * 2 * c;
    out[int64_t(k) * 2 * c + ch] = 0.0f + float(s[c + ch] * double(chan[c + ch]));
    out[int64_t(k) * 2 * c + c + ch] = 0.0f + float(s[ch]);
  }
}

__global__ void bn_backward_channel_kernel(int c, const double* __restrict__ sums, double count,
                                           const float* __restrict__ w, float* __restrict__ chan) {
  for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x)
    kernel::bn_backward_channel(w[ch], chan[c + ch], sums[ch], sums[c + ch], count, &chan[4 * c + ch],
                                &chan[5 * c + ch], &chan[6 * c + ch]);
}

__global__ void bn_apply_kernel(int64_t n, int c, int hw, const float* __restrict__ x, const float* __restrict__ chan,
                                float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int ch = int(i / hw % c);
    y[i] = kernel::bn_apply_at(x[i], chan[2 * c + ch], chan[3 * c + ch]);
  }
}

// Note [claimed runs]: the normalised value, then the residual add (z, when
// not nullptr) and the ReLU, as the Add and ReLU kernels compute them.
template <typename Values>
__global__ void bn_act_apply_kernel(int64_t n, int c, int hw, Values x, const float* __restrict__ z, bool relu,
                                    const float* __restrict__ chan, float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int ch = int(i / hw % c);
    const float v = kernel::bn_apply_at(x.at(i, ch), chan[2 * c + ch], chan[3 * c + ch]);
    y[i] = z ? kernel::add_at(v, z[i], relu) : relu ? kernel::relu_at(v) : v;
  }
}

// Element k (of channel ch) of backward: the gradient reaching the
// BatchNorm (bn_dy) into dz where given (a claimed run's add passes it to
// its shortcut), and dx's value from it.
template <typename Values>
__device__ __forceinline__ float bn_dx_at(int64_t k, int ch, int c, Values x, const float* dy, const float* relu_y,
                                          const float* __restrict__ chan, float* dz) {
  const float g = bn_dy(dy, relu_y, k);
  if (dz) dz[k] = g;
  return kernel::bn_backward_at(x.at(k, ch), g, chan[ch], chan[4 * c + ch], chan[5 * c + ch], chan[6 * c + ch]);
}

// dx (may be nowhere) and dz (may be nullptr), bn_dx_at's. dy may be dx's or
// dz's array (Note [claimed runs]): each element is read before it is
// written, so no __restrict__ on them.
template <typename Values, typename Out>
__global__ void bn_backward_kernel(int64_t n, int c, int hw, Values x, const float* dy,
                                   const float* __restrict__ relu_y, const float* __restrict__ chan, Out dx,
                                   float* dz) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int ch = int(i / hw % c);
    if (dx.p)
      dx.put(i, bn_dx_at(i, ch, c, x, dy, relu_y, chan, dz));
    else if (dz)
      dz[i] = bn_dy(dy, relu_y, i);
  }
}

// Note [bias in backward] (conv_bn.cu): bn_backward_kernel's values, each
// element by the thread, and in the block, that bn_run_sums_kernel's block
// (run, ch) of the same plan reads it with; each thread sums the dx it
// wrote, in order, and the block adds its threads' sums in block_sum2's
// tree into part[ch * runs + run]: bn_run_sums_kernel's sum of that dx.
template <typename Values, typename Out>
__global__ void __launch_bounds__(kThreads)
    bn_backward_runs_kernel(int64_t values, int64_t per_split, int c, int hw, Values x, const float* dy,
                            const float* __restrict__ relu_y, const float* __restrict__ chan, Out dx, float* dz,
                            double* __restrict__ part) {
  __shared__ double sa[kThreads], sb[kThreads];
  const int run = blockIdx.x, runs = gridDim.x, ch = blockIdx.y;
  const int64_t end = min(values, (run + 1) * per_split);
  double s = 0.0;
  for (int64_t j = run * per_split + threadIdx.x; j < end; j += kThreads) {
    const int64_t k = nchw_run_index(j, ch, c, hw);
    s += double(dx.put(k, bn_dx_at(k, ch, c, x, dy, relu_y, chan, dz)));
  }
  block_sum2(sa, sb, s, 0.0);
  if (threadIdx.x == 0) part[int64_t(ch) * runs + run] = sa[0];
}

// The same over an NHWC tensor, as nhwc_run_sums_kernel reads it.
template <typename Values, typename Out>
__global__ void __launch_bounds__(kThreads)
    nhwc_backward_runs_kernel(int64_t rows, int64_t per_split, int c, Values x, const float* dy,
                              const float* __restrict__ relu_y, const float* __restrict__ chan, Out dx, float* dz,
                              double* __restrict__ part) {
  __shared__ double sa[kThreads];
  const int run = blockIdx.x, runs = gridDim.x, warp = threadIdx.x / kNhwcGroup;
  const int ch = blockIdx.y * kNhwcGroup + threadIdx.x % kNhwcGroup;
  const int64_t end = min(rows, (run + 1) * per_split);
  double s = 0.0;
  if (ch < c) {
    for (int64_t r = run * per_split + warp; r < end; r += kNhwcWarps) {
      const int64_t k = r * c + ch;
      s += double(dx.put(k, bn_dx_at(k, ch, c, x, dy, relu_y, chan, dz)));
    }
  }
  nhwc_warps_sum(sa, s, ch, c, part + int64_t(ch) * runs + run);
}

// channel_sums_cuda and channel_sums_nhwc_cuda of any values.
template <typename Values>
void nchw_sums(cuda::Context& ctx, Values x, const float* mean, int images, int c, int hw, double* parts,
               double* out, int shards = 1) {
  const int64_t values = int64_t(images) * hw;
  DDP_CHECK(values < (int64_t(1) << 31), values, " values a channel in one call; at most 2^31 are supported");
  check_sum_grid("channel sums", c, shards);
  const BnSplit plan = plan_bn_split(values, c, ctx.sms());
  const cudaStream_t s = ctx.compute();
  bn_run_sums_kernel<<<dim3(unsigned(plan.splits), unsigned(c), unsigned(shards)), kThreads, 0, s>>>(
      values, plan.per_split, c, hw, values * c, x, mean, parts);
  DDP_CUDA_CHECK_LAUNCH(bn_run_sums_kernel);
  add_runs(ctx, int64_t(c) * shards, plan.splits, parts, out, s);
}

template <typename Values>
void nhwc_sums(cuda::Context& ctx, Values x, const float* mean, int64_t rows, int c, double* parts, double* out,
               int shards = 1) {
  DDP_CHECK(rows < (int64_t(1) << 31), rows, " values a channel in one call; at most 2^31 are supported");
  if (c <= 0) return;
  check_sum_grid("channel sums", c, shards);
  const BnSplit plan = plan_nhwc_split(rows, c, ctx.sms());
  const cudaStream_t s = ctx.compute();
  nhwc_run_sums_kernel<<<dim3(unsigned(plan.splits), unsigned(nhwc_channel_groups(c)), unsigned(shards)), kThreads, 0,
                         s>>>(rows, plan.per_split, c, x, mean, parts);
  DDP_CUDA_CHECK_LAUNCH(nhwc_run_sums_kernel);
  add_runs(ctx, int64_t(c) * shards, plan.splits, parts, out, s);
}

// Note [bias in backward]: backward's element-wise pass in the runs of
// nchw_sums's or nhwc_sums's plan, dx's per-channel sums into out (parts:
// their runs' sums), the bits those would give of the dx written.
template <typename Values, typename Out>
void backward_runs(cuda::Context& ctx, Layout layout, int images, int c, int hw, Values x, const float* dy,
                   const float* relu_y, const float* chan, Out dx, float* dz, double* parts, double* out) {
  const int64_t values = int64_t(images) * hw;
  DDP_CHECK(values < (int64_t(1) << 31), values, " values a channel in one call; at most 2^31 are supported");
  check_sum_grid("BatchNorm2d backward", c, 1);
  const cudaStream_t s = ctx.compute();
  BnSplit plan;
  if (layout == Layout::NHWC) {
    plan = plan_nhwc_split(values, c, ctx.sms());
    nhwc_backward_runs_kernel<<<dim3(unsigned(plan.splits), unsigned(nhwc_channel_groups(c))), kThreads, 0, s>>>(
        values, plan.per_split, c, x, dy, relu_y, chan, dx, dz, parts);
    DDP_CUDA_CHECK_LAUNCH(nhwc_backward_runs_kernel);
  } else {
    plan = plan_bn_split(values, c, ctx.sms());
    bn_backward_runs_kernel<<<dim3(unsigned(plan.splits), unsigned(c)), kThreads, 0, s>>>(
        values, plan.per_split, c, hw, x, dy, relu_y, chan, dx, dz, parts);
    DDP_CUDA_CHECK_LAUNCH(bn_backward_runs_kernel);
  }
  add_runs(ctx, c, plan.splits, parts, out, s);
}

}  // namespace

CudaBatchNorm::CudaBatchNorm(const Op& op, cuda::Context& ctx, StatsReducer* stats, Layout layout)
    : op_(op),
      ctx_(ctx),
      stats_(stats),
      c_(op.in.c),
      hw_(op.in.h * op.in.w),
      layout_(layout),
      split_(ctx.next(NextKernel::BnSplitSums) || layout == Layout::NHWC),
      host_(size_t(2 * op.in.c)) {
  chan_ = static_cast<float*>(ctx_.alloc(sizeof(float) * 7 * size_t(c_)));
  sums_ = static_cast<double*>(ctx_.alloc(sizeof(double) * 2 * size_t(c_)));
  if (split_) parts_for(1);
  DDP_CUDA_CHECK(cudaMemsetAsync(chan_, 0, sizeof(float) * 7 * size_t(c_), ctx_.compute()));
}

CudaBatchNorm::~CudaBatchNorm() {
  if (chan_) cudaFreeAsync(chan_, ctx_.compute());
  if (sums_) cudaFreeAsync(sums_, ctx_.compute());
  if (parts_) cudaFreeAsync(parts_, ctx_.compute());
}

void CudaBatchNorm::launch_sums(int images, int shards, const float* x, const float* mean, const float* dy,
                                double* out, const float* relu_y) {
  launch_sums(images, shards, BnValues{x}, mean, dy, out, relu_y);
}

void CudaBatchNorm::launch_sums(int images, int shards, const BnValues& x, const float* mean, const float* dy,
                                double* out, const float* relu_y) {
  DDP_CHECK(split_ || shards == 1, "BatchNorm2d ", op_.name, ": micro-shards in one launch need the split sums");
  if (!split_) {
    if (x.h) return block_sums(HalfValues{x.h, x.prec, x.bias}, images, mean, dy, relu_y, out);
    return block_sums(FloatValues{x.f}, images, mean, dy, relu_y, out);
  }
  const int64_t values = int64_t(images) * hw_;
  DDP_CHECK(values < (int64_t(1) << 31), "BatchNorm2d ", op_.name, ": ", values,
            " values a channel in one call; at most 2^31 are supported");
  // The grids' second dimension is the channel (NCHW), the third the micro-shard.
  check_sum_grid("BatchNorm2d " + op_.name, c_, shards);
  double* parts = parts_for(shards);
  if (x.h) return split_sums(HalfValues{x.h, x.prec, x.bias}, images, shards, mean, dy, relu_y, parts, out);
  split_sums(FloatValues{x.f}, images, shards, mean, dy, relu_y, parts, out);
}

template <typename Values>
void CudaBatchNorm::block_sums(Values x, int images, const float* mean, const float* dy, const float* relu_y,
                               double* out) {
  const cudaStream_t s = ctx_.compute();
  if (!dy) {
    bn_sums_kernel<<<c_, kThreads, 0, s>>>(images, c_, hw_, x, mean, out);
    DDP_CUDA_CHECK_LAUNCH(bn_sums_kernel);
  } else {
    bn_grad_sums_kernel<<<c_, kThreads, 0, s>>>(images, c_, hw_, x, mean, dy, relu_y, out);
    DDP_CUDA_CHECK_LAUNCH(bn_grad_sums_kernel);
  }
}

template <typename Values>
void CudaBatchNorm::split_sums(Values x, int images, int shards, const float* mean, const float* dy,
                               const float* relu_y, double* parts, double* out) {
  const cudaStream_t s = ctx_.compute();
  const int64_t values = int64_t(images) * hw_;
  if (layout_ == Layout::NHWC) {
    if (!dy) return nhwc_sums(ctx_, x, mean, values, c_, parts, out, shards);
    const BnSplit plan = plan_nhwc_split(values, c_, ctx_.sms());
    nhwc_run_grad_sums_kernel<<<dim3(unsigned(plan.splits), unsigned(nhwc_channel_groups(c_)), unsigned(shards)),
                                kThreads, 0, s>>>(values, plan.per_split, c_, x, mean, dy, relu_y, parts);
    DDP_CUDA_CHECK_LAUNCH(nhwc_run_grad_sums_kernel);
    add_runs(ctx_, int64_t(2) * c_ * shards, plan.splits, parts, out, s);
    return;
  }
  if (!dy) return nchw_sums(ctx_, x, mean, images, c_, hw_, parts, out, shards);
  const BnSplit plan = plan_bn_split(values, c_, ctx_.sms());
  bn_run_grad_sums_kernel<<<dim3(unsigned(plan.splits), unsigned(c_), unsigned(shards)), kThreads, 0, s>>>(
      values, plan.per_split, c_, hw_, values * c_, x, mean, dy, relu_y, parts);
  DDP_CUDA_CHECK_LAUNCH(bn_run_grad_sums_kernel);
  add_runs(ctx_, int64_t(2) * c_ * shards, plan.splits, parts, out, s);
}

void CudaBatchNorm::param_grads_of_shards(int shards, const double* sums, float* out) {
  if (shards <= 0 || c_ <= 0) return;
  bn_param_grads_shards_kernel<<<cuda_grid(int64_t(c_) * shards), kCudaThreads, 0, ctx_.compute()>>>(c_, shards, sums,
                                                                                                      chan_, out);
  DDP_CUDA_CHECK_LAUNCH(bn_param_grads_shards_kernel);
}

// parts_ with room for `shards` micro-shards' runs (two sums a channel each),
// grown stream-ordered: what read the old one has been issued before.
double* CudaBatchNorm::parts_for(int shards) {
  const size_t n = 2 * size_t(c_) * size_t(max_sum_runs(c_, ctx_.sms())) * size_t(std::max(shards, 1));
  if (parts_size_ < n) {
    if (parts_) ctx_.free(parts_);
    parts_ = static_cast<double*>(ctx_.alloc(sizeof(double) * n));
    parts_size_ = n;
  }
  return parts_;
}

void channel_sums_cuda(cuda::Context& ctx, const float* x, const float* mean, int images, int c, int hw,
                       double* parts, double* out, int shards) {
  nchw_sums(ctx, FloatValues{x}, mean, images, c, hw, parts, out, shards);
}

void channel_sums_nhwc_cuda(cuda::Context& ctx, const float* x, const float* mean, int64_t rows, int c,
                            double* parts, double* out, int shards) {
  nhwc_sums(ctx, FloatValues{x}, mean, rows, c, parts, out, shards);
}

void channel_sums_nhwc_half_cuda(cuda::Context& ctx, const uint16_t* x, Precision p, int64_t rows, int c,
                                 double* parts, double* out) {
  nhwc_sums(ctx, HalfValues{x, p}, nullptr, rows, c, parts, out);
}

void channel_sums_half_cuda(cuda::Context& ctx, const uint16_t* x, Precision p, int images, int c, int hw,
                            double* parts, double* out) {
  nchw_sums(ctx, HalfValues{x, p}, nullptr, images, c, hw, parts, out);
}

void CudaBatchNorm::reduce(size_t n, const std::string& what) {
  if (!stats_) return;
  if (ctx_.next(NextKernel::SyncBnOnDevice)) {
    // One rank's sums are already every rank's (SyncBatchNorm at world size
    // 1: one-rank); over several the device communicator sums them on the
    // device.
    if (stats_->ranks() > 1 || !ctx_.next(NextKernel::OneRank))
      stats_->sum_on_device(sums_, n, op_.name + ": " + what);
    return;
  }
  stats_->sync_device(op_.name + ": " + what);  // Note [bounded copies to the host]
  DDP_CUDA_CHECK(cudaMemcpyAsync(host_.data(), sums_, sizeof(double) * n, cudaMemcpyDeviceToHost, ctx_.compute()));
  stats_->sum(host_.data(), n, op_.name + ": " + what);
  DDP_CUDA_CHECK(cudaMemcpyAsync(sums_, host_.data(), sizeof(double) * n, cudaMemcpyHostToDevice, ctx_.compute()));
}

void CudaBatchNorm::channel_sums(const OpArgs& a, size_t width, const RunSum& sum, const AfterSum* after,
                                 const std::string& what) {
  sum(0, a.batch, 1, sums_);
  if (after) (*after)(sums_);
  reduce(width, what);
}

void CudaBatchNorm::forward(const OpArgs& a) {
  forward_stats(a, BnValues{a.x[0]});
  const int64_t n = int64_t(a.batch) * c_ * hw_;
  if (n <= 0) return;
  bn_apply_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(n, c_, pixel_stride(), a.x[0], chan_, a.y);
  DDP_CUDA_CHECK_LAUNCH(bn_apply_kernel);
}

void CudaBatchNorm::forward_stats(const OpArgs& a, const BnValues& x) {
  const cudaStream_t s = ctx_.compute();
  const unsigned cgrid = cuda_grid(c_);
  if (a.mode == Mode::Eval) {
    bn_eval_kernel<<<cgrid, kCudaThreads, 0, s>>>(c_, op_.eps, a.p[0], a.p[1], a.buf[0], a.buf[1], chan_);
    DDP_CUDA_CHECK_LAUNCH(bn_eval_kernel);
  } else {
    const double count = double(a.batch) * hw_ * (stats_ ? stats_->ranks() : 1);
    DDP_CHECK(count > 1, "BatchNorm2d ", op_.name, ": training needs more than one value per channel, got ", count);
    const int64_t image = int64_t(c_) * hw_;
    channel_sums(
        a, size_t(c_),
        [&](int64_t first, int images, int shards, double* out) {
          launch_sums(images, shards, x + first * image, nullptr, nullptr, out);
        },
        nullptr, "batch mean");
    bn_mean_kernel<<<cgrid, kCudaThreads, 0, s>>>(c_, sums_, count, chan_);
    DDP_CUDA_CHECK_LAUNCH(bn_mean_kernel);
    channel_sums(
        a, size_t(c_),
        [&](int64_t first, int images, int shards, double* out) {
          launch_sums(images, shards, x + first * image, chan_, nullptr, out);
        },
        nullptr, "batch variance");
    bn_train_kernel<<<cgrid, kCudaThreads, 0, s>>>(c_, sums_, count, op_.eps, op_.momentum, a.p[0], a.p[1], chan_,
                                                   a.buf[0], a.buf[1]);
    DDP_CUDA_CHECK_LAUNCH(bn_train_kernel);
    if (a.counter) ++*a.counter;
  }
}

void CudaBatchNorm::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  backward_from(a, BnValues{a.x[0]}, dy, nullptr, BnGrad{dx[0]}, nullptr);
}

void CudaBatchNorm::backward_from(const OpArgs& a, const BnValues& x, const float* dy, const float* relu_y,
                                  const BnGrad& dx, float* dz, double* dx_sums) {
  const cudaStream_t s = ctx_.compute();
  const unsigned cgrid = cuda_grid(c_);
  const int64_t image = int64_t(c_) * hw_;
  // sum(dy) and sum(dy (x - mean)): 2c values. This rank's sums make its
  // weight and bias gradients; the input gradient needs them over every
  // rank the statistics came from.
  const AfterSum grads = [&](const double* sums) {
    bn_param_grads_kernel<<<cgrid, kCudaThreads, 0, s>>>(c_, sums, chan_, a.dp[0], a.dp[1]);
    DDP_CUDA_CHECK_LAUNCH(bn_param_grads_kernel);
  };
  channel_sums(
      a, 2 * size_t(c_),
      [&](int64_t first, int images, int shards, double* out) {
        launch_sums(images, shards, x + first * image, chan_, dy + first * image, out,
                    relu_y ? relu_y + first * image : nullptr);
      },
      &grads, "gradient sums");
  DDP_CHECK(!dx_sums || dx.f || dx.h, "BatchNorm2d ", op_.name, ": the sums of an input gradient not written");
  if (!dx.f && !dx.h && !dz) return;
  const double count = double(a.batch) * hw_ * (stats_ ? stats_->ranks() : 1);
  bn_backward_channel_kernel<<<cgrid, kCudaThreads, 0, s>>>(c_, sums_, count, a.p[0], chan_);
  DDP_CUDA_CHECK_LAUNCH(bn_backward_channel_kernel);
  const int64_t n = int64_t(a.batch) * c_ * hw_;
  if (n <= 0) {
    if (dx_sums) DDP_CUDA_CHECK(cudaMemsetAsync(dx_sums, 0, sizeof(double) * size_t(c_), s));  // no values: sums 0
    return;
  }
  // A 16-bit input has its gradient in 16 bits (Note [16-bit handoff]).
  DDP_CHECK(x.h ? !dx.f : !dx.h, "BatchNorm2d ", op_.name, ": an input and its gradient of two widths");
  if (dx_sums && x.h)
    return backward_runs(ctx_, layout_, a.batch, c_, hw_, HalfValues{x.h, x.prec, x.bias}, dy, relu_y, chan_,
                         HalfOut{dx.h, dx.prec}, dz, parts_for(1), dx_sums);
  if (dx_sums)
    return backward_runs(ctx_, layout_, a.batch, c_, hw_, FloatValues{x.f}, dy, relu_y, chan_, FloatOut{dx.f}, dz,
                         parts_for(1), dx_sums);
  const unsigned grid = cuda_grid(n);
  if (x.h)
    bn_backward_kernel<<<grid, kCudaThreads, 0, s>>>(n, c_, pixel_stride(), HalfValues{x.h, x.prec, x.bias}, dy,
                                                     relu_y, chan_, HalfOut{dx.h, dx.prec}, dz);
  else
    bn_backward_kernel<<<grid, kCudaThreads, 0, s>>>(n, c_, pixel_stride(), FloatValues{x.f}, dy, relu_y, chan_,
                                                     FloatOut{dx.f}, dz);
  DDP_CUDA_CHECK_LAUNCH(bn_backward_kernel);
}

void CudaBatchNorm::apply(const OpArgs& a, const BnValues& x, const float* z, bool relu) {
  const int64_t n = int64_t(a.batch) * c_ * hw_;
  if (n <= 0) return;
  const cudaStream_t s = ctx_.compute();
  if (x.h)
    bn_act_apply_kernel<<<cuda_grid(n), kCudaThreads, 0, s>>>(n, c_, pixel_stride(), HalfValues{x.h, x.prec, x.bias},
                                                               z, relu, chan_, a.y);
  else
    bn_act_apply_kernel<<<cuda_grid(n), kCudaThreads, 0, s>>>(n, c_, pixel_stride(), FloatValues{x.f}, z, relu,
                                                               chan_, a.y);
  DDP_CUDA_CHECK_LAUNCH(bn_act_apply_kernel);
}

CudaBatchNormAct::CudaBatchNormAct(const Graph& g, size_t i, cuda::Context& ctx, StatsReducer* stats, Layout layout)
    : CudaBatchNorm(g.ops[i], ctx, stats, layout),
      add_(g.ops[i + 1].kind == OpKind::Add),
      relu_(g.ops[i + 1].kind == OpKind::ReLU || g.ops[i + 1].relu) {
  DDP_CHECK(bn_act_run(g, i), "op ", g.ops[i].name, ": no BatchNorm run to claim");
}

// a.x: the BatchNorm's input, then the add's other one (run_inputs); a.y:
// the run's output, the ReLU's or the add's.
void CudaBatchNormAct::forward(const OpArgs& a) {
  const BnValues x{a.x[0]};
  forward_stats(a, x);
  apply(a, x, add_ ? a.x[1] : nullptr, relu_);
}

void CudaBatchNormAct::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  backward_from(a, BnValues{a.x[0]}, dy, relu_ ? a.y : nullptr, BnGrad{dx[0]}, add_ ? dx[1] : nullptr);
}

}  // namespace ddp::nn
