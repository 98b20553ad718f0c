// Launch interface of src/kernels/layer/moe_elementwise_sm90.cu (arguments already validated).
#pragma once
#include <cstddef>
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
// The un-permute with the router's part of dX folded in (the layers' last backward step):
//   out[t] = bf16(Σ_j w[t, j]·y[row_of[t, j]] + Σ_e dlogits[t, e]·wr[e])
// the same bits as launch_router_dgrad_fixed into a buffer, then launch_moe_combine with it as the
// addend. dlogits FP32 [tokens, experts]; wr BF16 [experts, cols], 16-byte aligned; cols % 8 == 0.
void launch_moe_combine_router_dgrad(const uint16_t* y, int64_t y_rows, int64_t cols, const int32_t* row_of,
                                     const float* w, int64_t tokens, int top_k, const float* dlogits,
                                     const uint16_t* wr, int experts, uint16_t* out, cudaStream_t stream);
// Whether the layers fold the router's dX into the un-permute (above) rather than run the
// separate kernel and add its FP32 [T, H] result; a function of E and top_k only.
bool router_dgrad_in_combine(int experts, int top_k);

// Batch-invariant router GEMMs (src/kernels/layer/moe_router_gemm_sm90.cu): one thread's fmaf
// chain in increasing k per output, so a token's row does not depend on how many tokens there are.
//   logits FP32 [tokens, experts] = x BF16 [tokens, hidden] · wr BF16 [experts, hidden]ᵀ
//   dx FP32 [tokens, hidden] = dlogits FP32 [tokens, experts] · wr BF16 [experts, hidden]
void launch_router_logits_fixed(const uint16_t* x, const uint16_t* wr, int64_t tokens, int experts, int hidden,
                                float* logits, cudaStream_t stream);
void launch_router_dgrad_fixed(const float* dlogits, const uint16_t* wr, int64_t tokens, int experts, int hidden,
                               float* dx, cudaStream_t stream);

// The router's weight gradient in a fixed order (both router modes; moe_router_gemm_sm90.cu):
//   dwr FP32 [experts, hidden] = dlogits FP32 [tokens, experts]ᵀ · x BF16 [tokens, hidden]
// Tokens in chunks of router_wgrad_chunk(tokens); chunk c's partial is one fmaf chain over its
// tokens in increasing order from +0; dwr = the partials added in chunk order (with one chunk,
// the partial itself). The order depends on `tokens` alone: reruns give the same bits. tokens = 0:
// dwr = 0. hidden % 8 == 0; x, dwr 16-byte aligned; partials (16-byte aligned) holds
// router_wgrad_partial_floats(max_tokens, experts, hidden) floats for any tokens <= max_tokens
// (unused, and may be null, when that is 0).
int64_t router_wgrad_chunk(int64_t tokens);
size_t router_wgrad_partial_floats(int64_t max_tokens, int experts, int hidden);
void launch_router_wgrad_fixed(const float* dlogits, const uint16_t* x, int64_t tokens, int experts, int hidden,
                               float* partials, float* dwr, cudaStream_t stream);

}  // namespace mxmoe::detail
