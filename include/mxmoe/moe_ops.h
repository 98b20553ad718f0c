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

// Row gather into the padded expert layout, in BF16 (the unquantized counterpart of
// quantize_mxfp8_gather, for exact-mode GEMMs whose A image is the BF16 rows themselves):
//   out[r, :] = x[row_index[r], :] for r < min(out_rows, *rows_used); a zero row where
//   row_index[r] < 0 or >= x_rows; rows at or beyond *rows_used are not written.
// The values are copied exactly, except that −0 comes out as +0 (it is moe_combine with one slot
// and weight 1, summed from +0). x BF16 [x_rows, cols]; row_index int32 [out_rows]; rows_used
// optional device int32 scalar (e.g. &padded_offsets[E]; null: all out_rows rows); out BF16
// [out_rows, cols]. cols % 8 == 0; 16-byte aligned x, out.
void moe_gather_rows(const __nv_bfloat16* x, int64_t x_rows, int64_t cols, const int32_t* row_index,
                     int64_t out_rows, const int32_t* rows_used, __nv_bfloat16* out, cudaStream_t stream = nullptr);

}  // namespace mxmoe

namespace mxmoe {

// Backward of the combine, in the padded layout (used rows r < *rows_used; null: all rows):
//   with t = row_index[r] and j the last slot with row_of[t, j] == r:
//     dy[r, :] = bf16(w[t, j] · dout[t, :])       and      dw[t, j] = Σ_n dout[t, n] · y[r, n]
//   rows no slot claims (row_index[r] < 0 or >= tokens: padding; or no slot of t naming r) get
//   dy = 0; slots that claim no used row get dw = 0; rows >= *rows_used are not written. FP32 sums
//   in a fixed order. One warp per token (dout[t] read once for its k rows); MXMOE_COMBINE_BWD=rows
//   (read on every call) runs the former one-warp-per-row kernel instead, with the same bits; any
//   other value but "tokens" throws.
//   dout BF16 [tokens, cols]; y, dy BF16 [rows, cols]; row_index int32 [rows]; row_of int32 [tokens, k];
//   w, dw FP32 [tokens, k]. cols % 8 == 0; 16-byte aligned dout, y, dy.
void moe_combine_backward(const __nv_bfloat16* dout, const __nv_bfloat16* y, int64_t rows, int64_t cols,
                          const int32_t* rows_used, const int32_t* row_index, const int32_t* row_of, const float* w,
                          int64_t tokens, int top_k, __nv_bfloat16* dy, float* dw, cudaStream_t stream = nullptr);

// The same, but instead of dy it writes the scale of each row, row_w[r] = w[t, j] (0 for padding),
// FP32 [rows]: quantize_mxfp8_gather_scaled(dout, ..., row_index, row_w, ...) then forms
// dy = bf16(row_w · dout) inside the quantizer (same bits) without a BF16 dy round trip.
void moe_combine_backward_scales(const __nv_bfloat16* dout, const __nv_bfloat16* y, int64_t rows, int64_t cols,
                                 const int32_t* rows_used, const int32_t* row_index, const int32_t* row_of,
                                 const float* w, int64_t tokens, int top_k, float* row_w, float* dw,
                                 cudaStream_t stream = nullptr);

// SwiGLU backward on the padded layout: with g = gu[r, i], u = gu[r, I + i], d = dh[r, i]:
//   dgu[r, i] = bf16(d · u · silu'(g)),  dgu[r, I + i] = bf16(d · silu(g)),  silu'(g) = s(1 + g(1 - s)).
//   gu, dgu BF16 [rows, 2I]; dh BF16 [rows, I]; rows at or beyond *rows_used are not written.
void moe_swiglu_backward(const __nv_bfloat16* gu, const __nv_bfloat16* dh, int64_t rows, int64_t inter,
                         const int32_t* rows_used, __nv_bfloat16* dgu, cudaStream_t stream = nullptr);

// Router backward: dlogits [tokens, E] FP32 from the gradient of the routing weights dw [tokens, k]
// (softmax renormalised: dl = p ⊙ (dp − p·dp) with dp_e = c·(dw_e/S − Σ_j dw_j p_j/S²); sigmoid:
// dl_e = c·(dw_e/S − Σ_j dw_j s_j/S²)·s_e(1 − s_e) for the selected e). One warp per token, fixed
// order. logits as given to moe_topk; ids, dw [tokens, k]. The selection has no gradient.
void moe_router_backward(const float* logits, const int32_t* topk_ids, const float* dw, int64_t tokens,
                         int num_experts, const RouterParams& params, float* dlogits, cudaStream_t stream = nullptr);

}  // namespace mxmoe
