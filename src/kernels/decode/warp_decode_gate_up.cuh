// One gate/up output h[b, j, i] by one warp (warp_decode_gate_up_sm90.cu and the fused step,
// warp_decode_fused_sm90.cu): the gate row and the up row of slot j's expert, streamed with 16-byte
// loads, lane l taking the chunks l, l+32, ...; FP32 accumulation in increasing K per lane, the
// fixed xor butterfly, SwiGLU in registers, one store. MXFP8 chunks are 16 E4M3 inside one
// 32-block: chunk sum from 0, then fma(chunk_sum, 2^(s-127), acc) — exact scaling.
// kUnroll (chunks of each row in flight per lane) changes only when loads are issued, never the
// order of the arithmetic: every caller gets the same bits.
// p.ids may point to global or shared memory (generic loads); x is read through the
// non-coherent path, so it must not be written while the kernel runs.
#pragma once
#include <cstdint>

#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_common.cuh"
#include "mxmoe/mx_format.h"

namespace mxmoe::detail::gate_up {

// Weight rows of slot j of token b: the routed expert's [2I, K] block, or the shared expert.
struct RowPair {
  const uint8_t* gate;
  const uint8_t* up;
  const uint8_t* gate_scales;
  const uint8_t* up_scales;
};

template <bool kMx>
__device__ __forceinline__ RowPair slot_rows(const GateUpLaunch& p, int b, int j, int i) {
  const int64_t H = p.hidden, I = p.inter;
  const int64_t row_bytes = kMx ? H : 2 * H;
  const int64_t scale_row = H / kMxBlock;
  const uint8_t* w;
  const uint8_t* s = nullptr;
  if (j < p.top_k) {
    const int64_t e = dev::clamp_expert(p.ids[int64_t(b) * p.top_k + j], p.num_experts);
    w = static_cast<const uint8_t*>(p.w1.data) + e * 2 * I * row_bytes;
    if (kMx) s = p.w1.scales + e * 2 * I * scale_row;
  } else {
    w = static_cast<const uint8_t*>(p.w1.shared_data);
    if (kMx) s = p.w1.shared_scales;
  }
  RowPair r;
  r.gate = w + int64_t(i) * row_bytes;
  r.up = w + (I + i) * row_bytes;
  r.gate_scales = kMx ? s + int64_t(i) * scale_row : nullptr;
  r.up_scales = kMx ? s + (I + i) * scale_row : nullptr;
  return r;
}

// BF16 weights: chunks of 8 elements; lane sums g and u over its chunks in increasing K.
template <int kUnroll>
__device__ __forceinline__ void dot_rows_bf16(const RowPair& r, const uint8_t* x, int hidden, int lane, float& ag,
                                              float& au) {
  const int nchunks = hidden / 8;
  for (int c0 = lane; c0 < nchunks; c0 += 32 * kUnroll) {
    uint4 gw[kUnroll], uw[kUnroll];  // [kUnroll] x 16 B of each row
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      gw[t] = make_uint4(0u, 0u, 0u, 0u);
      uw[t] = gw[t];
      if (c < nchunks) {
        gw[t] = dev::ldg_stream_v4(r.gate + int64_t(c) * 16);
        uw[t] = dev::ldg_stream_v4(r.up + int64_t(c) * 16);
      }
    }
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      if (c < nchunks) {
        const uint4 xv = dev::ldg_v4(x + int64_t(c) * 16);
        ag = dev::dot8_bf16_bf16(gw[t], xv, ag);
        au = dev::dot8_bf16_bf16(uw[t], xv, au);
      }
    }
  }
}

// MXFP8 weights: chunks of 16 E4M3 (half a 32-block, scale byte c/2).
template <int kUnroll>
__device__ __forceinline__ void dot_rows_mx(const RowPair& r, const uint8_t* x, int hidden, int lane, float& ag,
                                            float& au) {
  const int nchunks = hidden / 16;
  for (int c0 = lane; c0 < nchunks; c0 += 32 * kUnroll) {
    uint4 gw[kUnroll], uw[kUnroll];  // [kUnroll] x 16 E4M3 of each row
    uint32_t gs[kUnroll], us[kUnroll];
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      gw[t] = make_uint4(0u, 0u, 0u, 0u);
      uw[t] = gw[t];
      gs[t] = 0u;
      us[t] = 0u;
      if (c < nchunks) {
        gw[t] = dev::ldg_stream_v4(r.gate + int64_t(c) * 16);
        uw[t] = dev::ldg_stream_v4(r.up + int64_t(c) * 16);
        gs[t] = dev::ldg_u8(r.gate_scales + c / 2);
        us[t] = dev::ldg_u8(r.up_scales + c / 2);
      }
    }
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      if (c < nchunks) {
        const uint4 x0 = dev::ldg_v4(x + int64_t(c) * 32);
        const uint4 x1 = dev::ldg_v4(x + int64_t(c) * 32 + 16);
        ag = fmaf(dev::dot16_e4m3_bf16(gw[t], x0, x1), dev::e8m0_to_f32(gs[t]), ag);
        au = fmaf(dev::dot16_e4m3_bf16(uw[t], x0, x1), dev::e8m0_to_f32(us[t]), au);
      }
    }
  }
}

// The task a warp's index t (0 <= t < B·S·I) stands for. Token order (p.rows_order = 0): t itself, i.e.
// token by token. Rows order (default since run 128): t's block of kBlock (= a CTA's warps) adjacent rows
// is g = t / kBlock, the blocks of all B·S (token, slot) pairs for rows ig·kBlock .. come side by side
// (g = ig·B·S + b·S + j), so the tokens that share an expert (and the shared expert, which every token
// has) read its rows at the same time and all but the first find them in L2. I % kBlock == 0 (I % 8 ==
// 0 is a host check). Each task's arithmetic is the same either way, so are the bits.
template <int kBlock>
__device__ __forceinline__ int64_t task_of(const GateUpLaunch& p, int64_t t) {
  if (!p.rows_order) return t;
  const int64_t g = t / kBlock, pairs = int64_t(p.batch) * p.slots;
  const int64_t ig = g / pairs, bj = g - ig * pairs;
  return bj * p.inter + ig * kBlock + (t - g * kBlock);
}

// Shared expert first (p.shared_first; a shared expert is slot k = S - 1): warps 0 .. B·I - 1 take the
// shared expert's tasks (in rows order the B tokens' blocks of kBlock rows side by side, else token by
// token), the rest the routed slots' tasks in task_of's order over k slots. So the shared expert's rows
// come first in the grid, and since B·I % kBlock == 0 a CTA holds shared tasks only or routed tasks only
// (shared_first_cta). Each task's arithmetic is the same, so are the bits.
template <int kBlock>
__device__ __forceinline__ int64_t task_of_shared_first(const GateUpLaunch& p, int64_t t) {
  const int64_t B = p.batch, I = p.inter, k = p.slots - 1, S = p.slots;
  const int64_t ns = B * I;
  if (t < ns) {
    int64_t b, i;
    if (p.rows_order) {
      const int64_t g = t / kBlock, ig = g / B;
      b = g - ig * B;
      i = ig * kBlock + (t - g * kBlock);
    } else {
      b = t / I;
      i = t - b * I;
    }
    return (b * S + k) * I + i;
  }
  const int64_t u = t - ns;
  if (!p.rows_order) {
    const int64_t b = u / (k * I);
    return b * S * I + (u - b * k * I);  // (b·S + j)·I + i with j·I + i = u - b·k·I
  }
  const int64_t g = u / kBlock, pairs = B * k;
  const int64_t ig = g / pairs, bj = g - ig * pairs;
  const int64_t b = bj / k, j = bj - b * k;
  return (b * S + j) * I + ig * kBlock + (u - g * kBlock);
}

// Whether CTA `cta` (kBlock warps, one task each) holds only shared-expert tasks under p.shared_first:
// those read neither the router's ids nor its weights, only x (complete before the router passed its own
// wait) and the shared weights, so they may start before griddepcontrol.wait.
template <int kBlock>
__device__ __forceinline__ bool shared_first_cta(const GateUpLaunch& p, int64_t cta) {
  return (cta + 1) * kBlock <= int64_t(p.batch) * p.inter;
}

// The whole output of task = (b·S + j)·I + i (i fastest): both dot products, SwiGLU
// silu(g)·u = (g / (1 + e^-g))·u in FP32, one store by lane 0. task < B·S·I (caller's check).
template <bool kMx, bool kHBf16, int kUnroll>
__device__ __forceinline__ void output(const GateUpLaunch& p, int64_t task, int lane) {
  const int i = int(task % p.inter);
  const int64_t bj = task / p.inter;
  const int j = int(bj % p.slots);
  const int b = int(bj / p.slots);

  const RowPair rows = slot_rows<kMx>(p, b, j, i);
  const uint8_t* x = reinterpret_cast<const uint8_t*>(p.x + int64_t(b) * p.hidden);
  float ag = 0.0f, au = 0.0f;
  if constexpr (kMx) {
    dot_rows_mx<kUnroll>(rows, x, p.hidden, lane, ag, au);
  } else {
    dot_rows_bf16<kUnroll>(rows, x, p.hidden, lane, ag, au);
  }
  ag = dev::warp_sum(ag);
  au = dev::warp_sum(au);
  if (lane == 0) {
    const float hv = (ag / (1.0f + expf(-ag))) * au;
    const int64_t idx = (int64_t(b) * p.slots + j) * p.inter + i;
    if constexpr (kHBf16) {
      static_cast<uint16_t*>(p.h)[idx] = dev::f32_to_bf16_bits(hv);
    } else {
      static_cast<float*>(p.h)[idx] = hv;
    }
  }
}

}  // namespace mxmoe::detail::gate_up
