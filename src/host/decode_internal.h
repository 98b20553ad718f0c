// The warp-decode launchers' internal forms (src/host/decode.cpp), used by decode_step
// (src/host/decode_expert_centric.cpp): the public decode_router and decode_gate_up with one more argument.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/decode.h"

namespace mxmoe::detail {

// decode_router; x_f32 (null: none) also receives x as FP32 [batch, hidden] in the gate/up kernel's
// chunk-interleaved layout (dev::x_f32_index in src/kernels/decode/warp_decode_common.cuh, x_f32_per float4 a
// chunk: 4 for MXFP8 weights, 2 for BF16), 16-byte aligned.
void decode_router_impl(const __nv_bfloat16* x, int batch, int hidden, const __nv_bfloat16* router_w,
                        int num_experts, const RouterParams& params, int32_t* topk_ids, float* topk_weights,
                        cudaStream_t stream, float* x_f32, int x_f32_per);

// decode_gate_up; x_f32 (null: none) is that copy of the same x, written by decode_router_impl ahead of this
// launch on the same stream (x_f32_per = 4 for MXFP8 w1, 2 for BF16). The routed tasks then read it instead of x
// (the same bits); it is ignored with BF16 h or a non-default MXFP8 launch bound.
void decode_gate_up_impl(const __nv_bfloat16* x, int batch, int hidden, int inter, const DecodeWeights& w1,
                         int num_experts, const int32_t* topk_ids, int top_k, void* h, DecodeHDtype h_dtype,
                         cudaStream_t stream, const float* x_f32);

}  // namespace mxmoe::detail
