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

// mode: 0 = fast, 1 = exact. out_dtype: 0 = bf16, 1 = fp32. num_sms: 0 = all. Y = X · Wᵀ.
int mxmoe_m_grouped_mxfp8_gemm_nt(const void* a_data, const void* a_scales,
                                  const void* a_fast_data, const void* a_fast_scales,
                                  int64_t m_total, const void* b_data, const void* b_scales,
                                  const void* b_fast_data, const void* b_fast_scales,
                                  int num_experts, int64_t n, int64_t k, const void* offsets,
                                  void* y, int mode, int out_dtype, int num_sms, void* stream) {
  return c_api_guarded([&] {
    mxmoe::MxOperand a, b;
    a.data = static_cast<const uint8_t*>(a_data);
    a.scales = static_cast<const uint8_t*>(a_scales);
    a.fast_data = static_cast<const uint8_t*>(a_fast_data);
    a.fast_scales = static_cast<const uint8_t*>(a_fast_scales);
    b.data = static_cast<const uint8_t*>(b_data);
    b.scales = static_cast<const uint8_t*>(b_scales);
    b.fast_data = static_cast<const uint8_t*>(b_fast_data);
    b.fast_scales = static_cast<const uint8_t*>(b_fast_scales);
    mxmoe::GemmOptions opts;
    opts.mode = static_cast<mxmoe::GemmMode>(mode);
    opts.out_dtype = static_cast<mxmoe::GemmOutDtype>(out_dtype);
    opts.num_sms = num_sms;
    opts.stream = static_cast<cudaStream_t>(stream);
    mxmoe::m_grouped_mxfp8_gemm_nt(a, m_total, b, num_experts, n, k,
                                   static_cast<const int32_t*>(offsets), y, opts);
  });
}

// k-grouped (wgrad): a = dYᵀ [N, M_total], b = Xᵀ [K, M_total] (column-wise MX), dw [E, N, K].
int mxmoe_k_grouped_mxfp8_gemm_nt(const void* a_data, const void* a_scales,
                                  const void* a_fast_data, const void* a_fast_scales,
                                  const void* b_data, const void* b_scales,
                                  const void* b_fast_data, const void* b_fast_scales,
                                  int64_t m_total, int num_experts, int64_t n, int64_t k,
                                  const void* offsets, void* dw, int mode, int out_dtype,
                                  int accumulate, int num_sms, void* stream) {
  return c_api_guarded([&] {
    mxmoe::MxOperand a{static_cast<const uint8_t*>(a_data), static_cast<const uint8_t*>(a_scales),
                       static_cast<const uint8_t*>(a_fast_data),
                       static_cast<const uint8_t*>(a_fast_scales)};
    mxmoe::MxOperand b{static_cast<const uint8_t*>(b_data), static_cast<const uint8_t*>(b_scales),
                       static_cast<const uint8_t*>(b_fast_data),
                       static_cast<const uint8_t*>(b_fast_scales)};
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

}  // extern "C"
