// ddp::nn::Precision: what --precision computes convolutions and linear
// layers in.
//
// Note [tf32]: --precision tf32 is PyTorch's default for convolutions on
// Ampere and newer GPUs (cudnn.allow_tf32), and what
// torch.backends.cuda.matmul.allow_tf32 gives GEMMs: the products of fp32
// operands are taken on tensor cores with the operands' mantissas cut to 10
// bits, and accumulated in fp32; inputs, outputs and gradients stay fp32.
// That rounding is inside the GPU's kernels, so Model rounds nothing around
// them; a CPU has no TF32 arithmetic, and runs fp32 (as PyTorch's CPU
// kernels do under allow_tf32).
//
// Note [mixed precision]: PyTorch's autocast, the part of it a model of
// convolutions and linear layers meets. In bf16 or fp16 a Conv2d, a fused
// conv-relu-pool or a Linear takes its input, its weight and its bias rounded
// to the half format, accumulates in fp32, and gives its output rounded to
// it; backward takes d(output) rounded, and gives d(input) and its parameter
// gradients rounded, each gradient rounded before it is added to the fp32
// gradient buffer (where --accumulate sums micro-batches, as autocast's casts
// back to fp32 do). Every other op (BatchNorm, ReLU, pooling, the loss), the
// master weights and the optimizer stay fp32. In fp16 a value beyond 65504
// becomes an infinity, which is what the loss scaler (optim/grad_scaler.hpp)
// is for. Model (model.hpp) applies these roundings around the kernels,
// through Device::round, for every device alike; the product of two halves
// is exact in fp32, so fp32 kernels given rounded operands compute what half
// kernels accumulating in fp32 do, up to the order of their sums.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/core/half.hpp"         // float_to_bf16, float_to_fp16 and back
#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE

namespace ddp::nn {

enum class Precision { F32, TF32, BF16, F16 };

const char* to_string(Precision p);  // "fp32", "tf32", "bf16", "fp16"
// "fp32", "tf32", "bf16" or "fp16"; throws ddp::Error naming anything else.
Precision parse_precision(const std::string& s);

// Whether p is a 16-bit format (Note [mixed precision]: values rounded to
// it around the ops); fp32 and TF32 (Note [tf32]) keep fp32 values.
DDP_HOST_DEVICE inline bool is_half(Precision p) { return p == Precision::BF16 || p == Precision::F16; }

// x in p's 16-bit format (bf16 or fp16; ties to even, beyond fp16's range
// an infinity, NaN a NaN), and back: what the GPU's half kernels read and
// write (Note [half kernels], src/nn/cuda/half.cu). p is_half.
DDP_HOST_DEVICE inline uint16_t to_half_bits(Precision p, float x) {
  return p == Precision::BF16 ? float_to_bf16(x) : float_to_fp16(x);
}
DDP_HOST_DEVICE inline float half_bits_to_float(Precision p, uint16_t h) {
  return p == Precision::BF16 ? bf16_to_float(h) : fp16_to_float(h);
}

// x rounded to the nearest value of p's format, as a float (x itself for
// fp32 and TF32, whose values are fp32).
DDP_HOST_DEVICE inline float round_to(Precision p, float x) {
  return is_half(p) ? half_bits_to_float(p, to_half_bits(p, x)) : x;
}

// A 16-bit value v plus a bias b in precision p: v + b rounded, b rounded
// first, as a 16-bit bias is (Note [half kernels]; BatchNorm reads a
// convolution's output with it in Note [16-bit handoff]).
DDP_HOST_DEVICE inline float half_plus_bias(Precision p, float v, float b) { return round_to(p, v + round_to(p, b)); }

// Note [half kernels] (src/nn/cuda/half.cu): element i of an NCHW output of
// `channels` planes of `pixels` values, from its 16-bit convolution yh: with a
// bias b, half_plus_bias, else yh.
DDP_HOST_DEVICE inline float plane_from_half_at(int64_t i, int channels, int64_t pixels, Precision p,
                                                const uint16_t* yh, const float* b) {
  const float v = half_bits_to_float(p, yh[i]);
  return b ? half_plus_bias(p, v, b[(i / pixels) % channels]) : v;
}

}  // namespace ddp::nn
