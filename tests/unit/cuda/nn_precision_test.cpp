// --precision bf16|fp16 (and tf32) on the GPU (Note [half kernels],
// src/nn/cuda/half.cu; Note [tf32], nn/precision.hpp):
// cuDNN's and cuBLAS's 16-bit kernels against the CPU's fp32 kernels with
// Model's roundings (Note [mixed precision], nn/precision.hpp).
//  - One layer of each kind (a convolution with a bias, a strided one, the
//    fused conv-relu-pool, a linear layer) on values whose every product and
//    sum is exact in fp32: output and parameter gradients the same values on
//    both devices, NCHW and NHWC (Note [channels last]). This checks the wiring (which operand, which layout, added
//    or overwritten), not the roundings. (A first op's d(input) is never
//    computed; the models below need every layer's.)
//  - Whole models on random values: what autocast rounds is a value of the
//    format (the logits a linear layer gives; each convolution's and linear
//    layer's gradients after one backward), and two SGD steps follow the
//    CPU's within the format's rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/rng.hpp"         // inputs and labels
#include "ddp/nn/cuda/device.hpp"   // make_cuda_device, softmax_cross_entropy_cuda
#include "ddp/nn/graph.hpp"         // GraphBuilder, model_graph
#include "ddp/nn/model.hpp"         // Model, init_state, softmax_cross_entropy
#include "ddp/nn/precision.hpp"     // Precision, round_to
#include "ddp/optim/kernels.hpp"    // the CPU and GPU optimizer kernels
#include "ddp/optim/optimizer.hpp"  // Optimizer
#include "nn_cuda_test_util.hpp"

namespace ddp::nn {
namespace {

using nn_cuda_test::agrees;
using nn_cuda_test::agrees_in_scale;
using nn_cuda_test::DeviceArray;
using nn_cuda_test::on_grid;
using nn_cuda_test::to_host;

constexpr Precision kHalves[] = {Precision::BF16, Precision::F16};

class CudaHalf : public nn_cuda_test::GpuTest {};

// One graph on the CPU and on the GPU, from one state, both in precision p;
// the GPU's activations in `layout` (Note [channels last]).
struct Twins {
  Twins(cuda::Context& ctx, const Graph& g, const ModelState& s, Precision p, Layout layout = Layout::NCHW)
      : cpu_dev(make_cpu_device(2)),
        gpu_dev(make_cuda_device(ctx, CudaDeviceOptions{layout})),
        cpu(g, *cpu_dev),
        gpu(g, *gpu_dev) {
    for (Model* m : {&cpu, &gpu}) {
      m->set_state(s);
      m->set_precision(p);
    }
  }
  std::unique_ptr<Device> cpu_dev, gpu_dev;
  Model cpu, gpu;
};

// Device::round is precision.hpp's round_to, bit for bit, specials included.
TEST_F(CudaHalf, RoundingIsTheHostsBitForBit) {
  std::vector<float> x = nn_cuda_test::normal(4096, 3, 1000.0);
  for (float v : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, -1e9f, 1e-7f, 6e-8f, 3e-8f, 1e-40f, 3.4e38f})
    x.push_back(v);
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  auto dev = make_cuda_device(ctx());
  for (Precision p : kHalves) {
    SCOPED_TRACE(to_string(p));
    DeviceArray<float> gx(ctx(), x), gy(ctx(), x.size());
    dev->round(gy.get(), gx.get(), x.size(), p);
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = round_to(p, x[i]);
    EXPECT_EQ(nn_cuda_test::bits(gy.download()), nn_cuda_test::bits(want));
  }
}

// One op of a graph on both devices, through Model, on grid values.
struct LayerCase {
  const char* name;
  Shape input;
  std::function<int(GraphBuilder&)> build;  // the op on b.input(); returns its output
};

// Values k * step, |k| <= range (bias: plus half a step, so that conv + bias
// is never 0 and relu's mask is the same on both devices). With inputs at
// 1/2 and weights at 1/4 (|k| <= 1), d(output) at 1/8, the convolutions' and
// the linear layer's sums are at most 125 of their unit (conv + bias), the
// gradients' at most 72: exact in bf16's 8 significant bits and fp16's 11,
// so the 16-bit results are those exact values on both devices. The pooled
// outputs are not 16-bit values (up to 356 units of 1/128), but both devices
// round the same exact fp32 average. An algorithm that is not exact on exact
// inputs (FFT, Winograd) could leave a residue of a few ulps, or a tiny
// value where the sum is 0: hence 1e-6 of each tensor's scale, far below
// what a wrong operand, layout or accumulation moves.
TEST_F(CudaHalf, EachLayerIsTheCpusRoundings) {
  const int batch = 2, classes = 6;
  const std::vector<LayerCase> cases = {
      {"conv", {3, 5, 5}, [](GraphBuilder& b) { return b.conv("conv", b.input(), 4, 3, 1, 1); }},
      {"strided conv", {3, 6, 6}, [](GraphBuilder& b) { return b.conv("conv", b.input(), 4, 3, 2, 1); }},
      {"conv relu pool", {2, 6, 6}, [](GraphBuilder& b) { return b.conv_relu_pool("conv", b.input(), 3, 3); }},
      {"linear", {1, 4, 5}, [](GraphBuilder& b) { return b.linear("fc", b.flatten("flat", b.input()), classes); }},
  };
  for (const LayerCase& c : cases) {
    GraphBuilder b(c.name, c.input, /*pytorch_init=*/true);
    const Graph g = b.finish(c.build(b));
    ModelState s = init_state(g, 1);
    for (const TensorInfo& t : g.params) {
      const bool bias = t.name.size() > 4 && t.name.compare(t.name.size() - 4, 4, "bias") == 0;
      const std::vector<float> v =
          bias ? on_grid(t.numel, 7 + t.offset, 1.0f / 16, 8, 1.0f / 32) : on_grid(t.numel, 7 + t.offset, 0.25f, 1);
      std::copy(v.begin(), v.end(), s.params.begin() + long(t.offset));
    }
    const size_t nx = size_t(batch) * size_t(c.input.numel()), ny = size_t(batch) * size_t(g.output_shape().numel());
    const std::vector<float> x = on_grid(nx, 1, 0.5f, 1), dy = on_grid(ny, 2, 0.125f, 1);
    // TF32 too (Note [tf32]): these values keep every bit in its 10-bit
    // mantissas, so its tensor cores must give fp32's results exactly.
    // Both layouts (Note [channels last]) but for LeNet's fused layer: NCHW
    // only; with --gpu-kernels proven and next (16-bit NCHW's bias gradient
    // summed in runs: conv-bias-sums).
    struct Run {
      Precision p;
      Layout layout;
      bool next;
    };
    std::vector<Run> runs;
    for (Precision p : {Precision::BF16, Precision::F16, Precision::TF32})
      for (Layout layout : {Layout::NCHW, Layout::NHWC})
        for (bool next : {false, true})
          if (layout == Layout::NCHW || g.ops[0].kind != OpKind::ConvReluPool) runs.push_back({p, layout, next});
    for (const auto& [p, layout, next] : runs) {
      SCOPED_TRACE(std::string(c.name) + ", " + to_string(p) + ", " + to_string(layout) + (next ? ", next" : ""));
      ctx().set_next_kernels(next);
      Twins t(ctx(), g, s, p, layout);
      Model &cpu = t.cpu, &gpu = t.gpu;
      const float* y = cpu.forward(x.data(), batch);
      const std::vector<float> cpu_y(y, y + ny);
      cpu.zero_grads();
      cpu.backward(dy.data(), batch);
      const std::vector<float> cpu_grads(cpu.grads(), cpu.grads() + g.num_params);

      // The GPU's input and output gradient in its layout, its output back.
      DeviceArray<float> gx(ctx(), nn_cuda_test::to_layout(x, batch, c.input, layout)),
          gdy(ctx(), nn_cuda_test::to_layout(dy, batch, g.output_shape(), layout));
      const std::vector<float> gpu_y = nn_cuda_test::from_layout(to_host(ctx(), gpu.forward(gx.get(), batch), ny),
                                                                 batch, g.output_shape(), layout);
      gpu.zero_grads();
      gpu.backward(gdy.get(), batch);
      EXPECT_TRUE(agrees_in_scale(gpu_y.data(), cpu_y.data(), ny, 1e-6)) << "output";
      std::vector<float> grads = to_host(ctx(), gpu.grads(), g.num_params);
      for (const TensorInfo& t : g.params)
        EXPECT_TRUE(agrees_in_scale(grads.data() + t.offset, cpu_grads.data() + t.offset, t.numel, 1e-6)) << t.name;
      // A second backward adds the same gradients again (Note [gradient
      // accumulation]).
      gpu.backward(gdy.get(), batch);
      std::vector<float> twice = cpu_grads;
      for (float& v : twice) v *= 2;
      grads = to_host(ctx(), gpu.grads(), g.num_params);
      for (const TensorInfo& t : g.params)
        EXPECT_TRUE(agrees_in_scale(grads.data() + t.offset, twice.data() + t.offset, t.numel, 1e-6))
            << t.name << ", added twice";
    }
  }
}

bool representable(Precision p, const std::vector<float>& v, size_t* at) {
  for (size_t i = 0; i < v.size(); ++i)
    if (round_to(p, v[i]) != v[i]) {
      *at = i;
      return false;
    }
  return true;
}

// What autocast rounds is a value of the format: the logits (a linear
// layer's output) and, after one backward from zero, every convolution's and
// linear layer's parameter gradients; and two SGD steps follow the CPU's
// (Model's roundings around fp32 kernels) within the format's rounding: the
// devices add in other orders, so a sum may round to the neighbouring 16-bit
// value, and training carries that on.
//
// How far, measured on an H200 (2026-11-26): LeNet's gradients within 0.2 of
// each tensor's largest, but for one bf16 tensor at step 1 (0.201). ResNet-18's
// logits within the bound at step 0 and 5.4% (bf16) and 3% (fp16) of their
// largest at step 1; its gradients 30% to 100% of their tensors' largest at
// step 0 already: its BatchNorms make a step that sensitive to rounding even
// in fp32 (Note [resnet's bounds], nn_model_test.cpp), so no per-tensor
// bound on them tells a wiring error from rounding. What holds it is the
// rest: the roundings, the logits, and the parameters' bound below.
TEST_F(CudaHalf, ModelsRoundWhereAutocastDoesAndFollowTheCpu) {
  const Shape input{1, 28, 28};
  const int classes = 10;
  for (const char* name : {"lenet", "resnet18"}) {
    const int batch = std::string(name) == "lenet" ? 32 : 8;
    const Graph g = model_graph(name, input, classes);
    const ModelState start = init_state(g, 42);
    for (Precision p : kHalves) {
      SCOPED_TRACE(std::string(name) + ", " + to_string(p));
      // fp16's scale for the loss scaler's sake: its small gradients (d2l's
      // N(0, 0.01) LeNet) would underflow unscaled.
      const float loss_scale = p == Precision::F16 ? 1024.0f : 1.0f;
      Twins t(ctx(), g, start, p);
      Model &cpu = t.cpu, &gpu = t.gpu;
      optim::Options opt;
      opt.momentum = 0.9;
      nn_cuda_test::OptimizerPair sgd(ctx(), opt, cpu, gpu);
      const size_t nl = size_t(batch) * classes, n = cpu.num_params();
      for (int step = 0; step < 2; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        const auto [x, labels] = nn_cuda_test::step_inputs(step, batch, size_t(input.numel()), classes);

        cpu.zero_grads();
        const float* logits = cpu.forward(x.data(), batch);
        const std::vector<float> cpu_logits(logits, logits + nl);
        std::vector<float> dlogits(nl);
        softmax_cross_entropy(logits, labels.data(), batch, classes, dlogits.data());
        for (float& d : dlogits) d *= loss_scale;
        cpu.backward(dlogits.data(), batch);
        const std::vector<float> cpu_grads(cpu.grads(), cpu.grads() + n);
        sgd.cpu.step(0.1, cpu.params(), cpu.grads(), 1.0f / loss_scale);

        DeviceArray<float> gx(ctx(), x), gdlogits(ctx(), nl);
        DeviceArray<int32_t> glabels(ctx(), labels);
        DeviceArray<double> sums(ctx(), std::vector<double>{0.0, 0.0});
        gpu.zero_grads();
        const float* glogits = gpu.forward(gx.get(), batch);
        const std::vector<float> gpu_logits = to_host(ctx(), glogits, nl);
        softmax_cross_entropy_cuda(glogits, glabels.get(), batch, classes, gdlogits.get(), sums.get(),
                                   ctx().compute());
        gpu.device().scale(gdlogits.get(), nl, loss_scale);
        gpu.backward(gdlogits.get(), batch);
        const std::vector<float> grads = to_host(ctx(), gpu.grads(), n);
        sgd.gpu.step(0.1, gpu.params(), gpu.grads(), 1.0f / loss_scale);

        size_t at = 0;
        EXPECT_TRUE(representable(p, gpu_logits, &at)) << "logit " << at << " = " << gpu_logits[at];
        for (size_t i = 0; i < g.ops.size(); ++i) {
          const OpKind k = g.ops[i].kind;
          if (k != OpKind::Conv2d && k != OpKind::ConvReluPool && k != OpKind::Linear) continue;
          for (size_t t : g.op_params[i]) {
            const TensorInfo& info = g.params[t];
            const std::vector<float> gt(grads.begin() + long(info.offset),
                                        grads.begin() + long(info.offset + info.numel));
            EXPECT_TRUE(representable(p, gt, &at)) << info.name << " grad " << at << " = " << gt[at];
          }
        }
        const bool bf16 = p == Precision::BF16, resnet = std::string(name) == "resnet18";
        const double tol = resnet && step > 0 ? (bf16 ? 0.15 : 0.1) : (bf16 ? 5e-2 : 1e-2);
        EXPECT_TRUE(agrees_in_scale(gpu_logits.data(), cpu_logits.data(), nl, tol)) << "logits";
        if (!resnet) {
          for (const TensorInfo& t : cpu.param_info())
            EXPECT_TRUE(agrees_in_scale(grads.data() + t.offset, cpu_grads.data() + t.offset, t.numel,
                                        bf16 ? 0.3 : 0.2))
                << t.name << " grad, in its own scale";
        }
        // The parameters' bound follows from the gradients': two steps of lr
        // 0.1 with momentum 0.9 move a parameter by at most 0.1 * (1 + 1.9)
        // times a gradient, so by at most 0.06 times the largest gradient
        // where the gradients differ by up to 0.2 of it (0.3 in bf16 makes it
        // 0.09; ResNet-18's parameters kept within 0.06 on the H200).
        double largest = 0;
        for (float v : cpu_grads) largest = std::max(largest, double(std::fabs(v)) / loss_scale);
        ModelState after;
        gpu.get_state(after);
        EXPECT_TRUE(agrees(after.params, std::vector<float>(cpu.params(), cpu.params() + n),
                           (bf16 ? 0.09 : 0.06) * largest))
            << "params";
      }
    }
  }
}

}  // namespace
}  // namespace ddp::nn
