// The router's logits for one expert and a group of tokens, by one warp (warp_decode_router_sm90.cu
// and the fused step, warp_decode_fused_sm90.cu): logits[t] = X[t]·Wr[e] in FP32.
// Fixed order (the bits of every logit): lane l adds the products of its 16-byte chunks
// c = l, l+32, l+64, ... in increasing c (dot8_bf16_bf16: increasing K inside a chunk), then the
// xor butterfly of warp_sum. kUnroll (chunks in flight per lane) changes only when loads are
// issued, never this order, so callers may pick it for their register budget.
#pragma once
#include <cstdint>

#include "kernels/decode/warp_decode_common.cuh"

namespace mxmoe::detail::router {

// w: Wr[e] (BF16 bits, 16-byte aligned, nchunks·16 bytes); x[t]: X rows of the kTokens tokens, in
// global memory (read through the non-coherent path) or, kXShared, copies in shared memory.
// Returns every token's logit in acc[t] on every lane.
template <int kTokens, int kUnroll, bool kXShared = false>
__device__ __forceinline__ void logits_warp(const uint8_t* w, const uint8_t* const (&x)[kTokens], int nchunks,
                                            int lane, float (&acc)[kTokens]) {
#pragma unroll
  for (int t = 0; t < kTokens; ++t) acc[t] = 0.0f;
  for (int c0 = lane; c0 < nchunks; c0 += 32 * kUnroll) {
    uint4 wv[kUnroll];  // [kUnroll] x 8 BF16 of Wr[e]
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + 32 * u;
      wv[u] = make_uint4(0u, 0u, 0u, 0u);
      if (c < nchunks) wv[u] = dev::ldg_stream_v4(w + int64_t(c) * 16);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + 32 * u;
      if (c < nchunks) {
#pragma unroll
        for (int t = 0; t < kTokens; ++t)
          acc[t] = dev::dot8_bf16_bf16(
              wv[u], kXShared ? *reinterpret_cast<const uint4*>(x[t] + c * 16) : dev::ldg_v4(x[t] + int64_t(c) * 16),
              acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) acc[t] = dev::warp_sum(acc[t]);
}

}  // namespace mxmoe::detail::router
