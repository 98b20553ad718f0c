// Launch interface of src/kernels/layer/moe_elementwise_sm90.cu (arguments already validated).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/decode/decode_launch.h"

namespace mxmoe::detail {

// p: the selection part of a RouterLaunch (host/routing.h); logits FP32 [tokens, p.num_experts].
void launch_moe_topk(const float* logits, int64_t tokens, const RouterLaunch& p, cudaStream_t stream);
void launch_moe_swiglu(const uint16_t* gu, int64_t rows, int64_t inter, const int32_t* rows_used, uint16_t* h,
                       cudaStream_t stream);
void launch_bf16_to_f32(const uint16_t* x, int64_t n, float* y, cudaStream_t stream);
void launch_moe_swiglu_backward(const uint16_t* gu, const uint16_t* dh, int64_t rows, int64_t inter,
                                const int32_t* rows_used, uint16_t* dgu, cudaStream_t stream);
// moe_combine_backward's two kernels, same bits: token-major (one warp per token, dout read once;
// the default) and row-major (one warp per padded row, dout read k times; MXMOE_COMBINE_BWD=rows,
// kept for one release for same-process A/B runs).
enum class CombineBackwardKernel { kTokens, kRows };
void launch_moe_combine_backward(const uint16_t* dout, const uint16_t* y, int64_t rows, int64_t cols,
                                 const int32_t* rows_used, const int32_t* row_index, const int32_t* row_of,
                                 const float* w, int64_t tokens, int top_k, uint16_t* dy, float* row_w, float* dw,
                                 CombineBackwardKernel kernel,
                                 cudaStream_t stream);  // exactly one of dy, row_w non-null (written)
void launch_moe_router_backward(const float* logits, const float* dw, int64_t tokens, const RouterLaunch& p,
                                float* dlogits, cudaStream_t stream);
// tokens_used: optional device int32 scalar; tokens at or beyond it are not written (moe_gather_rows).
void launch_moe_combine(const uint16_t* y, int64_t y_rows, int64_t cols, const int32_t* row_of, const float* w,
                        int64_t tokens, int top_k, const float* addend, const int32_t* tokens_used, uint16_t* out,
                        cudaStream_t stream);

// Batch-invariant router GEMMs (src/kernels/layer/moe_router_gemm_sm90.cu): one thread's fmaf
// chain in increasing k per output, so a token's row does not depend on how many tokens there are.
//   logits FP32 [tokens, experts] = x BF16 [tokens, hidden] · wr BF16 [experts, hidden]ᵀ
//   dx FP32 [tokens, hidden] = dlogits FP32 [tokens, experts] · wr BF16 [experts, hidden]
void launch_router_logits_fixed(const uint16_t* x, const uint16_t* wr, int64_t tokens, int experts, int hidden,
                                float* logits, cudaStream_t stream);
void launch_router_dgrad_fixed(const float* dlogits, const uint16_t* wr, int64_t tokens, int experts, int hidden,
                               float* dx, cudaStream_t stream);

}  // namespace mxmoe::detail
