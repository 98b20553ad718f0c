// Element-wise and gather pieces of the MoE layer (DESIGN.md §3, docs/notes/layer.md "Recipe").
// Device pointers, asynchronous on `stream`, no host synchronisation, bitwise deterministic.
// Rows of the padded expert layout come from the routing plan (include/mxmoe/moe_plan.h).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/decode.h"
#include "mxmoe/error.h"

namespace mxmoe {

// Top-k routing of the training layer from FP32 logits [tokens, E] (e.g. X·Wrᵀ by cuBLAS): the
// same selection rule and weights as decode_router (decode.h "Routing"), one warp per token.
//   topk_ids int32 [tokens, k], topk_weights FP32 [tokens, k]; E <= kDecodeMaxExperts.
void moe_topk(const float* logits, int64_t tokens, int num_experts, const RouterParams& params, int32_t* topk_ids,
              float* topk_weights, cudaStream_t stream = nullptr);

// SwiGLU on the padded expert layout: h[r, i] = silu(gu[r, i]) · gu[r, I + i], FP32 math, BF16 out.
//   gu BF16 [rows, 2I] (GEMM1's output: gate columns [0, I), up columns [I, 2I)), h BF16 [rows, I]
//   rows_used: optional device int32 scalar (e.g. &padded_offsets[E]); rows at or beyond it are
//   not written. inter % 8 == 0; 16-byte aligned pointers.
void moe_swiglu(const __nv_bfloat16* gu, int64_t rows, int64_t inter, const int32_t* rows_used,
                __nv_bfloat16* h, cudaStream_t stream = nullptr);

// Weighted gather-sum back to token order (combine, and the un-permute of dX with weights null):
//   out[t, n] = Σ_{j<k} w[t, j] · y[row_of[t, j], n]   (+ addend[t, n] if given)
// summed in FP32 in slot order j = 0..k-1 (then the addend), rounded once to BF16.
//   y BF16 [y_rows, cols]; row_of int32 [tokens, k] (a negative row contributes nothing);
//   w FP32 [tokens, k] or null (all ones); addend FP32 [tokens, cols] or null; out BF16 [tokens, cols].
//   cols % 8 == 0; 16-byte aligned y, addend, out.
void moe_combine(const __nv_bfloat16* y, int64_t y_rows, int64_t cols, const int32_t* row_of, const float* w,
                 int64_t tokens, int top_k, const float* addend, __nv_bfloat16* out, cudaStream_t stream = nullptr);

}  // namespace mxmoe
