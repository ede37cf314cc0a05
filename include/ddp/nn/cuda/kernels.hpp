// The GPU kernels of the op kinds (nn/device.hpp): one src/nn/cuda/*.cu
// beside each src/nn/cpu/*.cpp, made by the CUDA device (nn/cuda/device.hpp)
// and run on device pointers, every launch on the Context's compute stream.
// For .cu files only (cuDNN's headers); the deterministic mode's kernels
// (deterministic/) build on some of them.
// Their own arithmetic comes from kernel_math.hpp, which the host tests
// check against the CPU kernels.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t
#include <cudnn.h>             // descriptors and algorithms of CudnnConv

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn/device.hpp"             // Kernel, OpArgs, StatsReducer
#include "ddp/nn/graph.hpp"              // Op, Shape
#include "ddp/nn/layout.hpp"             // Layout: Note [channels last]
#include "ddp/nn/precision.hpp"          // Precision: Note [half kernels]
#include "ddp/runtime/cuda_context.hpp"  // cuda::Context, cuda::DeviceBuffer

namespace ddp::nn {

// Element-wise kernels: 256 threads a block, grid-stride loops, and a grid
// capped well above what fills an H200 (132 SMs x 2048 threads) so huge
// tensors do not ask for absurd grids.
constexpr int kCudaThreads = 256;
inline unsigned cuda_grid(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kCudaThreads - 1) / kCudaThreads, 8192)));
}

// 2x2 / stride-2 average pooling kernels (nn/cuda/pool.cu), floor on odd sizes
// as the CPU's: shared by AvgPool2d and ConvReluPool. With relu, forward
// pools max(x, 0); backward with a mask (the pooled input, nullptr: none)
// passes the gradient only where mask > 0. dx is written everywhere (zeros
// where an odd row or column fed no output).
void avgpool2_forward_cuda(int64_t planes, int h, int w, const float* x, bool relu, float* y, cudaStream_t stream);
void avgpool2_backward_cuda(int64_t planes, int h, int w, const float* dy, const float* mask, float* dx,
                            cudaStream_t stream);

// Note [half kernels] (nn/cuda/half.cu): the conversions around the 16-bit
// convolutions and GEMMs, each a launch on `stream`.
// dst = round_to(p, src), n values (dst may be src; fp32: a copy).
void round_cuda(float* dst, const float* src, int64_t n, Precision p, cudaStream_t stream);
// dst = src in p's 16-bit format (p is bf16 or fp16 here and below).
void to_half_cuda(uint16_t* dst, const float* src, int64_t n, Precision p, cudaStream_t stream);
// dst = src as floats (exact), or dst += src with add.
void from_half_cuda(float* dst, const uint16_t* src, int64_t n, Precision p, bool add, cudaStream_t stream);
// dst += round_to(p, src).
void add_rounded_cuda(float* dst, const float* src, int64_t n, Precision p, cudaStream_t stream);
// y = plane_from_half_at (precision.hpp) over images x channels x pixels.
void planes_from_half_cuda(float* y, const uint16_t* yh, const float* b, int64_t images, int channels,
                           int64_t pixels, Precision p, cudaStream_t stream);
// db[c] += round_to(p, the sum of channel c of dyh over images and pixels):
// a bias's gradient (a linear layer's: pixels = 1).
void channel_grad_from_half_cuda(float* db, const uint16_t* dyh, int64_t images, int channels, int64_t pixels,
                                 Precision p, cudaStream_t stream);
// Note [batch norm sums]'s runs for any packed NCHW tensor: out[ch] = the
// sum of x over channel ch's images x hw values (with mean: of
// (x - mean[ch])^2), in double, each channel cut into runs by plan_bn_split
// and the runs added in order (the same bits every call); parts holds
// max_bn_splits(c, ctx.sms()) * c doubles. With shards > 1 (Note [shards in
// one launch]): x holds that many such tensors one after another, each
// summed as a call of its own would, into out + k * c (parts: that many
// times the room).
void channel_sums_cuda(cuda::Context& ctx, const float* x, const float* mean, int images, int c, int hw,
                       double* parts, double* out, int shards = 1);
// The same over an NHWC tensor of `rows` rows (images x pixels) of c
// channels (Note [channels last sums], nn/cuda/bn_plan.hpp); parts holds
// max_sum_runs(c, ctx.sms()) * c doubles. The _half twins sum 16-bit values
// (a bias gradient in bf16 or fp16: Note [half kernels]).
void channel_sums_nhwc_cuda(cuda::Context& ctx, const float* x, const float* mean, int64_t rows, int c,
                            double* parts, double* out, int shards = 1);
void channel_sums_nhwc_half_cuda(cuda::Context& ctx, const uint16_t* x, Precision p, int64_t rows, int c,
                                 double* parts, double* out);
void channel_sums_half_cuda(cuda::Context& ctx, const uint16_t* x, Precision p, int images, int c, int hw,
                            double* parts, double* out);
// Note [channels last] (nn/layout.hpp), src/nn/cuda/channels_last.cu:
// dst = the KRSC copy of KCRS weights w [k, c, rs] in p's type (floats in
// fp32 and TF32, 16-bit bits in bf16 and fp16); dw += the KCRS form of a
// KRSC gradient src of p's type; y[i] += b[i % c] over n values of an NHWC
// tensor.
void weights_to_krsc_cuda(void* dst, const float* w, int k, int c, int rs, Precision p, cudaStream_t stream);
void add_weights_from_krsc_cuda(float* dw, const void* src, int k, int c, int rs, Precision p, cudaStream_t stream);
void add_channel_bias_cuda(float* y, const float* b, int64_t n, int c, cudaStream_t stream);
// The context's staging memory cut into pieces of these many bytes, each
// 256-byte aligned; valid until the next call on this context. An op's
// forward sizes the staging memory for its backward's pieces
// (staging_bytes): growing it waits for the device (Context::staging), which
// in backward would be with gradient all-reduces in flight.
std::vector<void*> staging_pieces(cuda::Context& ctx, const std::vector<size_t>& bytes);
size_t staging_bytes(const std::vector<size_t>& bytes);  // what those pieces take

// A cuDNN convolution of one geometry (nn/cuda/cudnn_conv.cu): the descriptors, and
// per batch size the algorithms chosen once (Note [conv algorithms]).
class GraphConv;  // nn/cuda/cudnn_graph.hpp

class CudnnConv {
 public:
  // out: the conv output shape the graph computed; checked against cuDNN's.
  // layout: of x, y and their gradients (Note [channels last]); the weights
  // are PyTorch's KCRS either way.
  CudnnConv(const std::string& op, Shape in, int out_c, int k, int stride, int pad, Shape out,
            Layout layout = Layout::NCHW);
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // What the convolution computes in from the next call on: fp32 (as made),
  // or bf16/fp16 on 16-bit copies of its operands (Note [half kernels]); the
  // calls below take and give fp32 either way.
  void set_precision(Precision p);
  Precision precision() const { return precision_; }

  // y = conv(x, w) + b (b may be nullptr); in 16 bits, rounded as Note [half
  // kernels] says.
  void forward(cuda::Context& ctx, int batch, const float* x, const float* w, const float* b, float* y);
  // dw += dconv/dw, db += sum of dy (if db), dx = dconv/dx (if dx): Note
  // [gradient accumulation] in device.hpp.
  void backward(cuda::Context& ctx, int batch, const float* x, const float* w, const float* dy, float* dw,
                float* db, float* dx);
  // Note [16-bit handoff] (src/nn/cuda/conv_bn.cu), in bf16 or fp16 only:
  // forward with y left in the format and without the bias (yh: cuDNN's
  // 16-bit result, which plane_from_half_at makes forward's y of), and
  // backward from d(y) in it (dyh: the bits backward rounds dy to); x, w and
  // the gradients as above. Forward writes x's 16-bit copy into xh where
  // given (else into staging memory), and backward takes it from xh where
  // given, x unchanged since (else it makes it again).
  void forward_to_half(cuda::Context& ctx, int batch, const float* x, const float* w, uint16_t* yh,
                       uint16_t* xh = nullptr);
  void backward_from_half(cuda::Context& ctx, int batch, const float* x, const uint16_t* xh, const float* w,
                          const uint16_t* dyh, float* dw, float* db, float* dx);
  // The bias gradients of `parts` consecutive batches of `images` images
  // (dy: their output gradients, one after another) in one pass, part k's
  // added at db + k * stride, each the bits backward adds for that batch
  // alone (Note [shards in one launch], nn/cuda/bn_plan.hpp). Only where
  // backward sums the bias as BatchNorm's sums are (fp32 and TF32 with
  // --gpu-kernels proven); false, nothing done, elsewhere.
  bool bias_grads_of_parts(cuda::Context& ctx, int images, int parts, const float* dy, float* db, size_t stride);
  // Note [shard streams] (deterministic/shards.hpp): whether backward calls
  // with no bias gradient, or with one where `bias`, may run at once on
  // ctx's side streams: everything they write but their outputs is the
  // context's per-stream scratch. Not where the bias is summed with
  // bias_grad, whose sums are this convolution's one buffer.
  bool concurrent_calls(const cuda::Context& ctx, bool bias) const { return !bias || !bias_by_sums(ctx); }
  // Whether backward sums the bias with bias_grad (else cuDNN's bias pass, or
  // 16-bit NCHW's one block a channel): in Note [batch norm sums]'s runs
  // (NHWC: Note [channels last sums]) of the output gradient as backward
  // takes it (16-bit in bf16 and fp16), the channels' sums then added by
  // add_bias_sums.
  bool bias_by_sums(const cuda::Context& ctx) const {
    return ctx.next(NextKernel::ConvBiasSums) || layout_ == Layout::NHWC;
  }
  // db[k * stride + ch] += sums[k * c + ch] of `parts` batches' channel sums
  // (device, doubles), each rounded to float once and then to the
  // precision: bias_grad's last step, also for sums taken elsewhere (Note
  // [bias in backward], src/nn/cuda/conv_bn.cu).
  void add_bias_sums(cuda::Context& ctx, const double* sums, float* db, int parts = 1, size_t stride = 0) const;

 private:
  struct Plan;
  Plan& plan(cuda::Context& ctx, int batch);
  // conv_plan_key of this convolution at `batch` in ctx (Note [measured
  // algorithms]).
  std::string plan_key(const cuda::Context& ctx, int batch) const;
  // The plan's algorithms from cuDNN's heuristics (Note [conv algorithms]),
  // or timed (Note [measured algorithms]) where the context asks for it.
  void legacy_plan(cuda::Context& ctx, Plan& p, int batch);
  void rank_algorithms(cuda::Context& ctx, Plan& p);
  void time_algorithms(cuda::Context& ctx, Plan& p, int batch);
  // --gpu-kernels proven: the plan's graphs (Note [graph engines]), and
  // whether one may run on these operands.
  void graph_plans(cuda::Context& ctx, Plan& p, int batch);
  bool graph_fits(cuda::Context& ctx, const GraphConv* g, std::initializer_list<const void*> operands) const;
  // db += the sum of dy per channel: fp32 dy (--gpu-kernels proven or NHWC),
  // or the 16-bit one over NHWC, the sum rounded to the precision.
  // With parts > 1 (fp32 and TF32): that many batches of `images` one after
  // another, part k's added at db + k * stride (bias_grads_of_parts).
  void bias_grad(cuda::Context& ctx, int images, const void* dy, float* db, int parts = 1, size_t stride = 0);
  void describe();  // the descriptors, for precision_
  void release();   // destroys them
  int64_t weight_numel() const { return int64_t(out_.c) * in_.c * k_ * k_; }
  // The staging pieces of a forward and a backward: in 16 bits (Note [half
  // kernels]) the operands' copies; in fp32 NHWC the KRSC weights and their
  // gradient; none in fp32 NCHW.
  std::vector<size_t> forward_pieces(int batch) const;
  std::vector<size_t> backward_pieces(int batch) const;
  std::vector<void*> forward_staging(cuda::Context& ctx, int batch) const;
  // The weights as cuDNN takes them (a KRSC copy with NHWC data, a 16-bit
  // copy in 16 bits), and the gradient it wrote that way added back into dw.
  void weights_for_cudnn(cuda::Context& ctx, const float* w, void* dst) const;
  void add_weight_grad(cuda::Context& ctx, const void* src, float* dw) const;
  // Note [channels last] in fp32 and TF32: cuDNN on KRSC weight copies.
  void forward_nhwc(cuda::Context& ctx, int batch, const float* x, const float* w, const float* b, float* y);
  void backward_nhwc(cuda::Context& ctx, int batch, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx);
  cudnnMathType_t run_math(cudnnMathType_t ranked) const;
  // cuDNN's three calls on operands of the descriptors' type, each with its
  // algorithm's math type; y and dx overwritten, dw = beta * dw + d(conv)/dw.
  void run_forward(cuda::Context& ctx, const Plan& p, const void* x, const void* w, void* y);
  void run_backward_filter(cuda::Context& ctx, const Plan& p, const void* x, const void* dy, float beta, void* dw);
  void run_backward_data(cuda::Context& ctx, const Plan& p, const void* w, const void* dy, void* dx);
  // fp32 NCHW: dw += d(conv)/dw, in place, or through staging where the
  // plan's graph writes with beta 0 (graph_plans).
  void backward_filter_add(cuda::Context& ctx, const Plan& p, const float* x, const float* dy, float* dw);
  void forward_half(cuda::Context& ctx, int batch, const float* x, const float* w, const float* b, float* y);
  void convolve_half(cuda::Context& ctx, const Plan& p, int batch, const float* x, const float* w,
                     const std::vector<void*>& at, uint16_t* yh, uint16_t* xh = nullptr);
  void backward_half(cuda::Context& ctx, int batch, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx);
  void backward_half_at(cuda::Context& ctx, const Plan& p, int batch, const float* x, const uint16_t* xh,
                        const float* w, const uint16_t* dyh, float* dw, float* db, float* dx,
                        const std::vector<void*>& at);
  std::string layer_;
  Shape in_, out_;
  int k_, stride_, pad_;
  Layout layout_;
  Precision precision_ = Precision::F32;
  cudnnFilterDescriptor_t w_desc_ = nullptr;
  cudnnConvolutionDescriptor_t conv_desc_ = nullptr;
  cudnnTensorDescriptor_t bias_desc_ = nullptr;
  std::map<int, std::unique_ptr<Plan>> plans_;  // by batch size
  cuda::DeviceBuffer bias_sums_;                // bias_grad's partial and channel sums (as doubles)
};

// One class per op kind; each is made for one op of a graph.
class CudaConv final : public Kernel {
 public:
  CudaConv(const Op& op, cuda::Context& ctx, Layout layout = Layout::NCHW);
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;
  bool set_precision(Precision p) override;
  // CudnnConv::bias_grads_of_parts.
  bool bias_grads_of_parts(int images, int parts, const float* dy, float* db, size_t stride) {
    return conv_.bias_grads_of_parts(ctx_, images, parts, dy, db, stride);
  }
  // CudnnConv::concurrent_calls.
  bool concurrent_calls(bool bias) const { return conv_.concurrent_calls(ctx_, bias); }

 private:
  cuda::Context& ctx_;
  CudnnConv conv_;
};

// conv -> relu -> 2x2 average pooling, as ConvReluPool on the CPU.
class CudaConvReluPool : public Kernel {
 public:
  CudaConvReluPool(const Op& op, cuda::Context& ctx);
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;
  bool set_precision(Precision p) override;

 protected:
  // The conv outputs kept for a batch of `batch` images (from the next
  // forward on).
  void reserve(int batch);
  // a's images as images first .. first + a.batch of the batch reserved for.
  void forward_at(const OpArgs& a, int64_t first);
  void backward_at(const OpArgs& a, int64_t first, const float* dy, const std::vector<float*>& dx);
  const Op& op_;
  cuda::Context& ctx_;

 private:
  float* pre(int64_t first);  // the conv outputs of image `first` on, in pre_
  Shape conv_;  // per-sample conv output, before pooling
  CudnnConv conv_op_;
  // conv + bias of the last forward (the relu mask backward needs: > 0;
  // each image at its place in the batch reserved for), and d(conv output)
  // in backward; sized for the largest batch seen. In 16 bits (Note [half
  // kernels]) also d(output) rounded.
  cuda::DeviceBuffer pre_, dpre_, dy_rounded_;
  int fwd_batch_ = -1;  // batch of the last forward
};

// A BatchNorm's input as its kernels read it, and where they write its
// gradient: floats, or the 16-bit values of precision prec (Note [16-bit
// handoff], src/nn/cuda/conv_bn.cu: a convolution's output and its
// gradient, the bits of the fp32 values they would be), the output's bias
// (per channel, may be nullptr) added as plane_from_half_at adds it.
struct BnValues {
  const float* f = nullptr;
  const uint16_t* h = nullptr;
  Precision prec = Precision::F32;
  const float* bias = nullptr;
  BnValues operator+(int64_t n) const { return {f ? f + n : nullptr, h ? h + n : nullptr, prec, bias}; }
};
struct BnGrad {
  float* f = nullptr;  // both nullptr: nowhere
  uint16_t* h = nullptr;
  Precision prec = Precision::F32;
};

// torch.nn.BatchNorm2d with kernels of our own (batch_norm.cu); with a
// StatsReducer, SyncBatchNorm (the per-channel sums summed over ranks:
// through the host, or with --gpu-kernels proven on the device).
class CudaBatchNorm : public Kernel {
 public:
  CudaBatchNorm(const Op& op, cuda::Context& ctx, StatsReducer* stats, Layout layout = Layout::NCHW);
  ~CudaBatchNorm() override;
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 protected:
  // forward's statistics, constants, running statistics and counter (train)
  // or constants (eval) from its input x: everything but writing y.
  void forward_stats(const OpArgs& a, const BnValues& x);
  // a.y = the normalised x, then the residual add (z, when not nullptr) and
  // the ReLU (relu), as the Add and ReLU kernels compute them.
  void apply(const OpArgs& a, const BnValues& x, const float* z, bool relu);
  // backward from input x with the gradient that reaches the BatchNorm: dy,
  // or where relu_y is not nullptr dy where relu_y > 0 (a ReLU after it); dx
  // and dz (each may be nowhere): the input's gradient, and that gradient
  // itself (a residual add's other input).
  // With dx_sums (device, c doubles; Note [bias in backward] in conv_bn.cu),
  // the pass that writes dx also sums it per channel, as written, into
  // dx_sums: the bits channel_sums_cuda (or its NHWC or 16-bit twin) would
  // give of the dx written.
  void backward_from(const OpArgs& a, const BnValues& x, const float* dy, const float* relu_y, const BnGrad& dx,
                     float* dz, double* dx_sums = nullptr);
  // What the element-wise passes divide a flat index by before taking it
  // modulo c: NCHW's pixels a plane, 1 in NHWC.
  int pixel_stride() const { return layout_ == Layout::NHWC ? 1 : hw_; }
  const float* chan() const { return chan_; }
  // sum(first, images, shards, out): launches the `width` per-channel sums
  // of each of `shards` consecutive runs of `images` images, from image
  // `first` of the call's batch on, run k's into out + k * width (device
  // memory). after(sums): backward's use of one run's sums, its part of the
  // weight and bias gradients (nullptr in forward).
  using RunSum = std::function<void(int64_t first, int images, int shards, double* out)>;
  using AfterSum = std::function<void(const double* sums)>;
  // A call's per-channel sums, into sums_: here sum over the whole batch,
  // then over the ranks with a StatsReducer (reduce).
  virtual void channel_sums(const OpArgs& a, size_t width, const RunSum& sum, const AfterSum* after,
                            const std::string& what);
  // sums_'s first n values summed over ranks when synchronised: a host
  // round trip (--gpu-kernels proven: on the device, and none for one rank).
  void reduce(size_t n, const std::string& what);
  // Launches the per-channel sums of `images` images from x into out
  // (device; Note [batch norm sums]): without dy, of x, or with mean of
  // (x - mean)^2 (c values); with dy and mean, sum(dy) then
  // sum(dy (x - mean)) (2c values), dy passed only where relu_y > 0 when
  // relu_y is given. shards > 1 (the split sums only): that many runs of
  // `images` images one after another, each summed as a launch of its own
  // would sum it, into out + k * (c or 2c) (Note [shards in one launch]).
  void launch_sums(int images, int shards, const float* x, const float* mean, const float* dy, double* out,
                   const float* relu_y = nullptr);
  void launch_sums(int images, int shards, const BnValues& x, const float* mean, const float* dy, double* out,
                   const float* relu_y = nullptr);
  bool split() const { return split_; }
  // Backward's weight and bias gradients of `shards` micro-shards from
  // their sums (2c each, shard-major) into out: micro-shard k's weight
  // gradient at out + k * 2c, its bias gradient c floats on, each the bits
  // the plain backward adds into zeroed gradients.
  void param_grads_of_shards(int shards, const double* sums, float* out);
  const Op& op_;
  cuda::Context& ctx_;
  StatsReducer* stats_;
  int c_, hw_;
  double* sums_ = nullptr;  // device: the sums (two doubles per channel)

 private:
  float* chan_ = nullptr;   // device, per channel: mean, invstd, scale, shift, ...
  Layout layout_;
  bool split_;                // --gpu-kernels proven or NHWC: the sums in runs
  double* parts_for(int shards);  // parts_ with room for `shards` calls' runs
  // launch_sums's one-block and split sums of x, a thread's reader of
  // values (batch_norm.cu).
  template <typename Values>
  void block_sums(Values x, int images, const float* mean, const float* dy, const float* relu_y, double* out);
  template <typename Values>
  void split_sums(Values x, int images, int shards, const float* mean, const float* dy, const float* relu_y,
                  double* parts, double* out);
  double* parts_ = nullptr;  // device: each channel's run sums (Note [batch norm sums])
  size_t parts_size_ = 0;    // doubles
  std::vector<double> host_;  // the sums on their way through the host
};

// --gpu-kernels proven, Note [claimed runs] (nn/model.hpp): a BatchNorm2d and
// the ReLU or residual add (with its ReLU) after it, as one kernel: the
// normalised value is added and rectified as it is written, and backward
// masks the gradient as it reads it; the same bits as the three ops.
class CudaBatchNormAct final : public CudaBatchNorm {
 public:
  // Op i of g, where bn_act_run (nn/cuda/bn_runs.hpp) says so.
  CudaBatchNormAct(const Graph& g, size_t i, cuda::Context& ctx, StatsReducer* stats, Layout layout);
  size_t ops() const override { return 2; }
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 private:
  bool add_, relu_;
};

// --gpu-kernels proven (conv-bn), Note [claimed runs]: a convolution and the
// BatchNorm after it, and that BatchNorm's ReLU or residual add where ops is
// 3 (conv_bn_run, nn/cuda/bn_runs.hpp), as one kernel; in bf16 and fp16 the
// convolution's output and its gradient pass between them in 16 bits (Note
// [16-bit handoff], conv_bn.cu). The same bits as the ops one by one.
class CudaConvBn final : public CudaBatchNorm {
 public:
  // Op i of g, a Conv2d heading a run of `ops` ops. grads: where a run's
  // backward keeps the convolution's output gradient, only during the
  // call: one buffer for every run of a model.
  CudaConvBn(const Graph& g, size_t i, size_t ops, cuda::Context& ctx, StatsReducer* stats, Layout layout,
             std::shared_ptr<cuda::DeviceBuffer> grads);
  size_t ops() const override { return ops_; }
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;
  bool set_precision(Precision p) override;

 private:
  const OpArgs& bn_args(const OpArgs& a);  // the BatchNorm's part of the run's arguments
  const float* bias(const OpArgs& a) const { return conv_params_ > 1 ? a.p[1] : nullptr; }  // the convolution's
  void reserve(const OpArgs& a);           // mid_ (and dmid_, in_half_) for a's batch
  BnValues mid(const OpArgs& a) const;     // mid_ as the BatchNorm reads it
  BnGrad dmid() const;                     // where the BatchNorm writes its input's gradient
  // Whether the BatchNorm's backward sums the convolution's bias gradient
  // (Note [bias in backward]), and where: else nullptr, the convolution
  // sums it.
  bool bias_in_bn() const;
  double* bias_sums();
  size_t ops_, conv_params_;
  bool add_, relu_;
  int64_t mid_numel_, in_numel_;  // a sample's convolution output and input
  CudnnConv conv_;
  std::string conv_name_;
  OpArgs bn_;
  // The convolution's output of the last forward (in 16 bits cuDNN's,
  // without the bias), and in 16 bits its input's 16-bit copy, made in
  // forward, read by backward; in backward the output's gradient (grads).
  // Floats, or 16-bit values two a float; sized for the largest batch seen.
  cuda::DeviceBuffer mid_, in_half_;
  std::shared_ptr<cuda::DeviceBuffer> dmid_;
  cuda::DeviceBuffer bias_sums_;  // bias_sums's c doubles
  int train_batch_ = -1;  // the batch of the last forward if it trained
};

class CudaRelu final : public Kernel {
 public:
  CudaRelu(const Op& op, cuda::Context& ctx) : n_(op.in.numel()), ctx_(ctx) {}
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 private:
  int64_t n_;
  cuda::Context& ctx_;
};

class CudaAdd final : public Kernel {
 public:
  CudaAdd(const Op& op, cuda::Context& ctx) : n_(op.in.numel()), relu_(op.relu), ctx_(ctx) {}
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 private:
  int64_t n_;
  bool relu_;
  cuda::Context& ctx_;
};

class CudaAvgPool final : public Kernel {
 public:
  CudaAvgPool(const Op& op, cuda::Context& ctx) : in_(op.in), ctx_(ctx) {}
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 private:
  Shape in_;
  cuda::Context& ctx_;
};

class CudaGlobalAvgPool final : public Kernel {
 public:
  CudaGlobalAvgPool(const Op& op, cuda::Context& ctx, Layout layout = Layout::NCHW)
      : in_(op.in), ctx_(ctx), layout_(layout) {}
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 private:
  Shape in_;
  cuda::Context& ctx_;
  Layout layout_;  // of the input (the output is the same in both)
};

class CudaFlatten final : public Kernel {
 public:
  CudaFlatten(const Op& op, cuda::Context& ctx) : n_(op.in.numel()), ctx_(ctx) {}
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 private:
  int64_t n_;
  cuda::Context& ctx_;
};

// y = x W^T + b on cuBLAS; W [out, in] row-major as the CPU's. In bf16 or
// fp16, cublasGemmEx on 16-bit copies (Note [half kernels]).
class CudaLinear final : public Kernel {
 public:
  CudaLinear(const Op& op, cuda::Context& ctx) : in_(int(op.in.numel())), out_(op.out_c), ctx_(ctx), name_(op.name) {}
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;
  bool set_precision(Precision p) override {
    precision_ = p;
    return true;
  }

 private:
  void forward_half(const OpArgs& a);
  void backward_half(const OpArgs& a, const float* dy, float* dx);
  std::vector<size_t> backward_pieces(int batch) const;  // Note [half kernels]
  int in_, out_;
  cuda::Context& ctx_;
  std::string name_;
  Precision precision_ = Precision::F32;
};

}  // namespace ddp::nn
