// --trace's GPU tracks (runtime/gpu_trace.hpp): the kernels' names as the
// trace and its tables show them. Recording itself needs a GPU and CUPTI
// (GpuTraining.TraceHasGpuTracks).
#include "ddp/runtime/gpu_trace.hpp"

#include <gtest/gtest.h>

namespace ddp::cuda {
namespace {

TEST(GpuTraceNames, KernelsAreNamedWithoutTheirParameters) {
  EXPECT_EQ(kernel_display_name("_Z14bn_sums_kernelPKfiiPd"), "bn_sums_kernel");
  // A template's return type goes too; "(anonymous namespace)" stays.
  EXPECT_EQ(kernel_display_name("_ZN3ddp2nn12_GLOBAL__N_114bn_sums_kernelIfEEvPKT_i"),
            "ddp::nn::(anonymous namespace)::bn_sums_kernel<float>");
  EXPECT_EQ(kernel_display_name("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
}

TEST(GpuTraceNames, NamesThatDoNotDemangleAreKept) {
  EXPECT_EQ(kernel_display_name("sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw"),
            "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw");
  EXPECT_EQ(kernel_display_name(""), "kernel");
  EXPECT_EQ(kernel_display_name(nullptr), "kernel");
}

}  // namespace
}  // namespace ddp::cuda
