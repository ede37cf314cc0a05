#include "ddp/nn/precision.hpp"

#include "ddp/core/error.hpp"

namespace ddp::nn {

const char* to_string(Precision p) {
  switch (p) {
    case Precision::TF32: return "tf32";
    case Precision::BF16: return "bf16";
    case Precision::F16: return "fp16";
    default: return "fp32";
  }
}

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::F32;
  if (s == "tf32") return Precision::TF32;
  if (s == "bf16") return Precision::BF16;
  if (s == "fp16") return Precision::F16;
  DDP_FAIL("precision must be fp32, tf32, bf16 or fp16, got '", s, "'");
}

}  // namespace ddp::nn
