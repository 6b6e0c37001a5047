// The kernel-name -> category rule (apps/compare/kernel_categories.h) on names as Kineto records them on
// NVIDIA and AMD, and a result's time breakdown from its profile.
#include <gtest/gtest.h>

#include <set>

#include "apps/compare/kernel_categories.h"

namespace tt {
namespace {

struct Named {
  const char* name;
  const char* kind;
  KernelCategory expected;
};

// Real names: cuBLAS (Hopper's nvjet and sm90 xmma, older sm80/ampere), CUTLASS, cuDNN, ATen's CUDA
// kernels, ours, NCCL, and on AMD rocBLAS/hipBLASLt (Tensile's Cijk_*), Composable Kernel and RCCL.
const Named kNames[] = {
    {"nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTT", "kernel", KernelCategory::kGemm},
    {"nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNN", "kernel", KernelCategory::kGemm},
    {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__"
     "5x_cublas",
     "kernel", KernelCategory::kGemm},
    {"sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_"
     "kernel__5x_cublas",
     "kernel", KernelCategory::kGemm},
    {"ampere_sgemm_128x64_tn", "kernel", KernelCategory::kGemm},
    {"void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(cutlass_80_wmma_"
     "tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)",
     "kernel", KernelCategory::kGemm},
    {"void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams<float>, "
     "float const*, float const*, float*, float const*, float const*, float const*, float const*, float*, void*, long, "
     "float*, int*)",
     "kernel", KernelCategory::kGemm},
    {"void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
     "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float "
     "const>, "
     "cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float "
     "const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>, float, "
     "float)",
     "kernel", KernelCategory::kGemm},
    {"cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "kernel",
     KernelCategory::kAttention},
    {"cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0", "kernel",
     KernelCategory::kAttention},
    {"fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, "
     "true, 64, 64, 64, true, true>::Params)",
     "kernel", KernelCategory::kAttention},
    {"fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::Sm80, "
     "float, true, false, false, 64, 64, 64, false>::Params)",
     "kernel", KernelCategory::kAttention},
    {"void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
     "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>"
     "(pytorch_flash::Flash_fwd_params)",
     "kernel", KernelCategory::kAttention},
    {"void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false, false>(float*, float const*, "
     "int, int, int, bool const*, int, bool)",
     "kernel", KernelCategory::kAttention},
    {"void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, true, false>(float*, float const*, int, "
     "int, int, bool const*, int, bool)",
     "kernel", KernelCategory::kLoss},
    {"void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
     "kernel", KernelCategory::kLoss},
    {"void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, "
     "float*, float const*, long const*, float const*, bool, long, long, long, long)",
     "kernel", KernelCategory::kLoss},
    {"void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, true>(int, float, float "
     "const*, float const*, float const*, float*, float*, float*)",
     "kernel", KernelCategory::kNormalisation},
    {"void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u, 16u, 32u, true, "
     "true, true>(long, long, float const*, float const*, float const*, float const*, float*, float*)",
     "kernel", KernelCategory::kNormalisation},
    {"void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel("
     "at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#6}::operator()() const::{lambda(float)#1}, "
     "std::array<char*, 2ul> >(int, at::native::(anonymous "
     "namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}"
     "::operator()() const::{lambda()#6}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)",
     "kernel", KernelCategory::kActivation},
    {"void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
     "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
     "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, float*, float*>("
     "at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous "
     "namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, "
     "double, double, bool, float*, float*)",
     "kernel", KernelCategory::kOptimizer},
    {"void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
     "namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::LpNormFunctor<float, "
     "(at::native::(anonymous namespace)::NormType)1, float, float>, float*, int>(...)",
     "kernel", KernelCategory::kOptimizer},
    {"void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, "
     "at::native::FillFunctor<float>, std::array<char*, 1ul>)",
     "kernel", KernelCategory::kCopyFill},
    {"void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_"
     "cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)"
     "#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
     "operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, "
     "at::native::gpu_kernel_impl_nocast<...>)",
     "kernel", KernelCategory::kCopyFill},
    {"void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<4u>, "
     "unsigned int, 3, 128, 1>(...)",
     "kernel", KernelCategory::kCopyFill},
    {"Memcpy DtoD (Device -> Device)", "memcpy", KernelCategory::kCopyFill},
    {"Memset (Device)", "memset", KernelCategory::kCopyFill},
    // Ours, as Kineto names them.
    {"void tt::kernels::(anonymous namespace)::rms_norm_forward_kernel<__nv_bfloat16, 4>(tt::kernels::RmsNormParams)",
     "kernel", KernelCategory::kNormalisation},
    {"void tt::kernels::(anonymous namespace)::flash_forward_kernel<__nv_bfloat16, 64, 64, 64, "
     "true>(tt::kernels::FlashParams)",
     "kernel", KernelCategory::kAttention},
    {"void tt::kernels::(anonymous namespace)::swiglu_strided_backward_kernel<float>(tt::kernels::SwigluParams)",
     "kernel", KernelCategory::kActivation},
    {"void tt::kernels::(anonymous namespace)::naive_swiglu_forward_kernel<float>(float const*, float const*, float*, "
     "long)",
     "kernel", KernelCategory::kActivation},
    {"void tt::kernels::(anonymous namespace)::naive_matmul_kernel<float>(float const*, float const*, float*, int, "
     "int, int)",
     "kernel", KernelCategory::kGemm},
    {"void tt::kernels::(anonymous namespace)::rope_kernel<__nv_bfloat16, true>(tt::kernels::RopeParams)", "kernel",
     KernelCategory::kRope},
    {"void tt::kernels::(anonymous "
     "namespace)::cross_entropy_forward_kernel<__nv_bfloat16>(tt::kernels::CrossEntropyParams)",
     "kernel", KernelCategory::kLoss},
    {"void tt::kernels::(anonymous namespace)::adamw_update_kernel<float>(tt::kernels::AdamWParams)", "kernel",
     KernelCategory::kOptimizer},
    // NCCL (and RCCL, which keeps the names); the profiler marks them "comm".
    {"ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm",
     KernelCategory::kCommunication},
    {"ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "kernel",
     KernelCategory::kCommunication},
    // AMD: Tensile (rocBLAS, hipBLASLt), Composable Kernel, CK's attention.
    {"Cijk_Ailk_Bljk_SB_MT64x64x16_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1_AF1EM1_AMAS3_ASE_ASGT_ASLT_ASAE01_ASCE01_ASEM1",
     "kernel", KernelCategory::kGemm},
    {"Cijk_Alik_Bljk_BBS_BH_Bias_HAS_SAV_UserArgs_MT128x128x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1", "kernel",
     KernelCategory::kGemm},
    {"void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl_cshuffle_v3<ck::tensor_layout::gemm::RowMajor>, true, "
     "(ck::InMemoryDataOperationEnum)0, 1, (ck::TailNumber)1>(ck::GridwiseGemm_xdl_cshuffle_v3<>::Argument)",
     "kernel", KernelCategory::kGemm},
    {"void ck_tile::kentry<64, 1, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync<> > >(...)", "kernel",
     KernelCategory::kAttention},
    // What no rule claims goes to "other": generic elementwise arithmetic, embedding gathers.
    {"void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
     "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, ...)",
     "kernel", KernelCategory::kOther},
    {"void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(...)",
     "kernel", KernelCategory::kOther},
};

TEST(KernelCategories, RealNamesOfEveryVendorAndLibrary) {
  for (const auto& n : kNames)
    EXPECT_STREQ(to_string(categorize_kernel(n.name, n.kind)), to_string(n.expected)) << n.name;
}

TEST(KernelCategories, EveryCategoryHasADistinctName) {
  std::set<std::string> names;
  for (auto c : kernel_categories()) names.insert(to_string(c));
  EXPECT_EQ(names.size(), kKernelCategoryCount);
}

nlohmann::json profiled_result(double step_ms) {
  nlohmann::json hotspots = nlohmann::json::array();
  auto add = [&](const char* name, const char* kind, double total_us) {
    hotspots.push_back({{"name", name}, {"kind", kind}, {"calls", 3}, {"total_us", total_us}});
  };
  add("nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNN", "kernel", 3000);  // 1 ms per step over 3 steps
  add("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "kernel", 1500);
  add("Memcpy DtoD (Device -> Device)", "memcpy", 300);
  add("mystery_kernel_a", "kernel", 600);
  add("mystery_kernel_b", "kernel", 900);
  return {{"summary", {{"step_ms", {{"median", step_ms}}}}},
          {"profile", {{"basis", "gpu_time"}, {"steps", 3}, {"hotspots", hotspots}}}};
}

TEST(KernelCategories, BreakdownSumsToGpuBusyAndListsOtherKernels) {
  const TimeBreakdown b = time_breakdown(profiled_result(4.0));
  EXPECT_NEAR(b.ms_per_step[static_cast<size_t>(KernelCategory::kGemm)], 1.0, 1e-12);
  EXPECT_NEAR(b.ms_per_step[static_cast<size_t>(KernelCategory::kAttention)], 0.5, 1e-12);
  EXPECT_NEAR(b.ms_per_step[static_cast<size_t>(KernelCategory::kCopyFill)], 0.1, 1e-12);
  EXPECT_NEAR(b.ms_per_step[static_cast<size_t>(KernelCategory::kOther)], 0.5, 1e-12);
  EXPECT_NEAR(b.gpu_busy_ms, 2.1, 1e-12);
  EXPECT_NEAR(b.host_gap_ms, 4.0 - 2.1, 1e-12);
  ASSERT_EQ(b.other_kernels.size(), 2u);
  EXPECT_EQ(b.other_kernels[0].first, "mystery_kernel_b") << "largest first";
  EXPECT_NEAR(b.other_kernels[0].second, 0.3, 1e-12);
}

// A profile with the union of the kernels' intervals (two streams at once): busy is the union, the categories
// still add up to their own times, and the difference is shown as concurrent time.
TEST(KernelCategories, KernelsOnTwoStreamsAtOnceCountOnceInGpuBusy) {
  nlohmann::json r = profiled_result(4.0);
  r["profile"]["gpu_busy_per_step_ms"] = 1.6;
  const TimeBreakdown b = time_breakdown(r);
  EXPECT_NEAR(b.gpu_busy_ms, 1.6, 1e-12);
  EXPECT_NEAR(b.concurrent_ms, 2.1 - 1.6, 1e-12);
  EXPECT_NEAR(b.host_gap_ms, 4.0 - 1.6, 1e-12);
  EXPECT_EQ(time_breakdown(profiled_result(4.0)).concurrent_ms, 0.0) << "older results: no union, nothing concurrent";
}

TEST(KernelCategories, HostGapIsNeverNegative) {
  // Kernels on two streams overlap: their summed time can exceed the step.
  EXPECT_EQ(time_breakdown(profiled_result(1.0)).host_gap_ms, 0.0);
}

TEST(KernelCategories, CpuProfileOrNoProfileHasNoBreakdown) {
  nlohmann::json cpu = profiled_result(4.0);
  cpu["profile"]["basis"] = "cpu_self_time";
  EXPECT_FALSE(has_gpu_profile(cpu));
  EXPECT_THROW(time_breakdown(cpu), std::runtime_error);
  nlohmann::json none = profiled_result(4.0);
  none.erase("profile");
  EXPECT_FALSE(has_gpu_profile(none));
}

}  // namespace
}  // namespace tt
