// C ABI of the grouped GEMMs for ctypes (bench/bench_gemm.py). Each function returns 0 on success
// and 1 on failure; the failure's message is then returned by mxmoe_gemm_last_error() (per
// thread, valid until the next call on that thread). Pointers are device pointers; `stream` is a
// cudaStream_t (0 = legacy default stream).
#include <cstdint>

#include "host/c_api_guard.h"
#include "mxmoe/gemm.h"

using mxmoe::detail::c_api_guarded;

extern "C" {

// Same message as mxmoe_last_error(); kept under this name for bench/bench_gemm.py.
const char* mxmoe_gemm_last_error() { return mxmoe::detail::c_api_last_error().c_str(); }

namespace {

mxmoe::MxOperand operand(const void* data, const void* scales, const void* fast_data,
                         const void* fast_scales, const void* image) {
  return {static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(scales),
          static_cast<const uint8_t*>(fast_data), static_cast<const uint8_t*>(fast_scales),
          static_cast<const __nv_bfloat16*>(image)};
}

}  // namespace

// mode: 0 = fast (reads fast_data, fast_scales), 1 = exact (reads image: BF16 [rows, K], see
// mxmoe_dequantize_mxfp8_bf16). out_dtype: 0 = bf16, 1 = fp32. num_sms: 0 = all. Y = X · Wᵀ.
// b_fast_scale_layout (gemm.h FastScaleLayout): 0 = kRow128 (b_fast_scales [E, ceil(K/128), N]),
// 1 = kBlock128 (fast mode only: b_fast_data in the 128x128-block form, b_fast_scales [E,
// ceil(K/128), mxmoe_fast_block_scales_pitch(N)]).
int mxmoe_m_grouped_mxfp8_gemm_nt_layout(const void* a_data, const void* a_scales, const void* a_fast_data,
                                         const void* a_fast_scales, const void* a_image, int64_t m_total,
                                         const void* b_data, const void* b_scales, const void* b_fast_data,
                                         const void* b_fast_scales, const void* b_image, int b_fast_scale_layout,
                                         int num_experts, int64_t n, int64_t k, const void* offsets, void* y,
                                         int mode, int out_dtype, int num_sms, void* stream) {
  return c_api_guarded([&] {
    const mxmoe::MxOperand a = operand(a_data, a_scales, a_fast_data, a_fast_scales, a_image);
    mxmoe::MxOperand b = operand(b_data, b_scales, b_fast_data, b_fast_scales, b_image);
    b.fast_scale_layout = static_cast<mxmoe::FastScaleLayout>(b_fast_scale_layout);
    mxmoe::GemmOptions opts;
    opts.mode = static_cast<mxmoe::GemmMode>(mode);
    opts.out_dtype = static_cast<mxmoe::GemmOutDtype>(out_dtype);
    opts.num_sms = num_sms;
    opts.stream = static_cast<cudaStream_t>(stream);
    mxmoe::m_grouped_mxfp8_gemm_nt(a, m_total, b, num_experts, n, k,
                                   static_cast<const int32_t*>(offsets), y, opts);
  });
}

// The same with B's fast scales per row (b_fast_scale_layout 0); kept for existing callers.
int mxmoe_m_grouped_mxfp8_gemm_nt(const void* a_data, const void* a_scales,
                                  const void* a_fast_data, const void* a_fast_scales,
                                  const void* a_image, int64_t m_total, const void* b_data,
                                  const void* b_scales, const void* b_fast_data,
                                  const void* b_fast_scales, const void* b_image, int num_experts,
                                  int64_t n, int64_t k, const void* offsets, void* y, int mode,
                                  int out_dtype, int num_sms, void* stream) {
  return mxmoe_m_grouped_mxfp8_gemm_nt_layout(a_data, a_scales, a_fast_data, a_fast_scales, a_image, m_total, b_data,
                                              b_scales, b_fast_data, b_fast_scales, b_image, 0, num_experts, n, k,
                                              offsets, y, mode, out_dtype, num_sms, stream);
}

// Bytes per (expert, 128-chunk) row of 128x128-block fast scales for n rows per expert
// (mx_format.h fast_block_scales_pitch).
int64_t mxmoe_fast_block_scales_pitch(int64_t n) { return mxmoe::fast_block_scales_pitch(n); }

// k-grouped (wgrad): a = dYᵀ [N, M_total], b = Xᵀ [K, M_total] (column-wise MX; exact mode: their
// BF16 images), dw [E, N, K]. image_layout (both images): 0 = row-major [rows, M_total]
// (mxmoe_dequantize_mxfp8_bf16), 1 = token-blocked [M_total/128][rows][128]
// (mxmoe_dequantize_mxfp8_bf16_token_blocked; gemm.h, ImageLayout).
// b_fast_scale_layout (gemm.h FastScaleLayout): 0 = kRow128 (b_fast_scales [M_total/128, K]), 1 = kBlock128
// (fast mode only: Xᵀ in 128x128 blocks, b_fast_scales [M_total/128, mxmoe_fast_block_scales_pitch(K)],
// made by mxmoe_rebase_mxfp8_fast_block128 with batch 1, rows K, cols M_total).
int mxmoe_k_grouped_mxfp8_gemm_nt_layout(const void* a_data, const void* a_scales, const void* a_fast_data,
                                         const void* a_fast_scales, const void* a_image, const void* b_data,
                                         const void* b_scales, const void* b_fast_data, const void* b_fast_scales,
                                         const void* b_image, int64_t m_total, int num_experts, int64_t n, int64_t k,
                                         const void* offsets, void* dw, int mode, int out_dtype, int accumulate,
                                         int num_sms, int image_layout, int b_fast_scale_layout, void* stream) {
  return c_api_guarded([&] {
    mxmoe::MxOperand a = operand(a_data, a_scales, a_fast_data, a_fast_scales, a_image);
    mxmoe::MxOperand b = operand(b_data, b_scales, b_fast_data, b_fast_scales, b_image);
    a.image_layout = b.image_layout = static_cast<mxmoe::ImageLayout>(image_layout);
    b.fast_scale_layout = static_cast<mxmoe::FastScaleLayout>(b_fast_scale_layout);
    mxmoe::GemmOptions opts;
    opts.mode = static_cast<mxmoe::GemmMode>(mode);
    opts.out_dtype = static_cast<mxmoe::GemmOutDtype>(out_dtype);
    opts.accumulate = accumulate != 0;
    opts.num_sms = num_sms;
    opts.stream = static_cast<cudaStream_t>(stream);
    mxmoe::k_grouped_mxfp8_gemm_nt(a, b, m_total, num_experts, n, k,
                                   static_cast<const int32_t*>(offsets), dw, opts);
  });
}

// The same with Xᵀ's fast scales per row (b_fast_scale_layout 0); kept for existing callers.
int mxmoe_k_grouped_mxfp8_gemm_nt(const void* a_data, const void* a_scales,
                                  const void* a_fast_data, const void* a_fast_scales,
                                  const void* a_image, const void* b_data, const void* b_scales,
                                  const void* b_fast_data, const void* b_fast_scales,
                                  const void* b_image, int64_t m_total, int num_experts, int64_t n,
                                  int64_t k, const void* offsets, void* dw, int mode, int out_dtype,
                                  int accumulate, int num_sms, int image_layout, void* stream) {
  return mxmoe_k_grouped_mxfp8_gemm_nt_layout(a_data, a_scales, a_fast_data, a_fast_scales, a_image, b_data, b_scales,
                                              b_fast_data, b_fast_scales, b_image, m_total, num_experts, n, k, offsets,
                                              dw, mode, out_dtype, accumulate, num_sms, image_layout, 0, stream);
}

}  // extern "C"
