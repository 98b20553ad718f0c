// Warp decode, gate/up projection with SwiGLU (DESIGN.md §4, include/mxmoe/decode.h):
//   h[b, j, i] = silu(g) · u,  g = X[b]·W1[e_j][i],  u = X[b]·W1[e_j][I + i],  silu(g) = g/(1+e^-g)
//   X BF16 [B, H] (16-byte aligned); W1 [E, 2I, H] BF16, or MXFP8 data E4M3 [E, 2I, H] + scales
//   E8M0 [E, 2I, H/32]; shared expert W1s [2I, H] as slot j = k; ids int32 [B, k];
//   h FP32 or BF16 [B, S, I].
// One warp owns one output h[b, j, i]: it streams the gate row and the up row (K-contiguous)
// with 16-byte loads, lane l taking the 16-byte chunks l, l+32, ... (each warp load reads 512
// contiguous bytes), kUnroll chunks of both rows in flight per lane before any is used
// (2·kUnroll·16 B = 128 B a lane, 4 KB a warp), FP32 accumulation, xor-butterfly warp sum, SwiGLU
// in registers, one store. MXFP8 chunks are 16 E4M3 inside one 32-block: one scale byte each.
// Warps are numbered with i fastest, so a CTA's 8 warps read 8 adjacent rows of one expert.
// At B = 1 (Qwen3-30B: k = 8, I = 768) that is 6144 warps = 768 CTAs: every SM holds ~6 CTAs.
// Programmatic Dependent Launch (src/host/pdl_launch.h): griddepcontrol.wait before x and the ids
// are read (they come from the kernels ahead of this one) and before h is written, then the
// dependents (decode_down) may launch.
// Registers: BF16 54; MXFP8 80 with the default launch bound (3 CTAs a SM; run 56: 1.02-1.08x a
// step) or 102 at 2 CTAs a SM (host switch MXMOE_DECODE_MX_GATE_UP_CTAS=2); no spills (-res-usage).
// Roofline: 2·2·I·H FLOPs per (token, slot); bytes 2·I·H·(2 | 1 + 1/32) per distinct expert.
// Tests: tests/gpu/test_decode_gpu.cpp. Bench: bench/bench_decode.py.
#include <cstdint>

#include "device/griddepcontrol.cuh"
#include "host/check.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_common.cuh"

namespace mxmoe::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;  // chunks of each row in flight per lane
static_assert(kThreads % 32 == 0, "whole warps");

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
__device__ __forceinline__ void dot_rows_bf16(const RowPair& r, const uint8_t* x, int hidden,
                                              int lane, float& ag, float& au) {
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

// MXFP8 weights: chunks of 16 E4M3 (half a 32-block, scale byte c/2); chunk sum from 0, then
// fma(chunk_sum, 2^(s-127), acc) — exact scaling.
__device__ __forceinline__ void dot_rows_mx(const RowPair& r, const uint8_t* x, int hidden,
                                            int lane, float& ag, float& au) {
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

template <bool kMx, bool kHBf16, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas) warp_decode_gate_up_kernel(const GateUpLaunch p) {
  const int lane = threadIdx.x & 31;
  const int64_t task = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t total = int64_t(p.batch) * p.slots * p.inter;
  device::griddepcontrol_wait();  // ids come from the router (the kernel ahead of this one)
  device::griddepcontrol_launch_dependents();
  if (task >= total) return;  // the whole warp leaves together
  const int i = int(task % p.inter);
  const int64_t bj = task / p.inter;
  const int j = int(bj % p.slots);
  const int b = int(bj / p.slots);

  const RowPair rows = slot_rows<kMx>(p, b, j, i);
  const uint8_t* x = reinterpret_cast<const uint8_t*>(p.x + int64_t(b) * p.hidden);
  float ag = 0.0f, au = 0.0f;
  if constexpr (kMx) {
    dot_rows_mx(rows, x, p.hidden, lane, ag, au);
  } else {
    dot_rows_bf16(rows, x, p.hidden, lane, ag, au);
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

template <bool kMx, bool kHBf16, int kMinCtas = 1>
void launch(const GateUpLaunch& p, cudaStream_t stream) {
  const int64_t total = int64_t(p.batch) * p.slots * p.inter;
  const int64_t blocks = (total + kWarps - 1) / kWarps;
  launch_with_pdl("decode_gate_up", warp_decode_gate_up_kernel<kMx, kHBf16, kMinCtas>,
                  dim3(unsigned(blocks)), dim3(kThreads), 0, stream, p);
}

}  // namespace

void launch_decode_gate_up(const GateUpLaunch& p, cudaStream_t stream) {
  if (p.w1.mxfp8 && p.min_ctas_per_sm >= 3) {  // launch bound: 80 registers, 3 CTAs a SM (default)
    if (p.h_bf16) launch<true, true, 3>(p, stream); else launch<true, false, 3>(p, stream);
  } else if (p.w1.mxfp8) {                        // 102 registers, 2 CTAs a SM
    if (p.h_bf16) launch<true, true>(p, stream); else launch<true, false>(p, stream);
  } else {
    if (p.h_bf16) launch<false, true>(p, stream); else launch<false, false>(p, stream);
  }
  MXMOE_CHECK_LAUNCH("decode_gate_up");
}

}  // namespace mxmoe::detail
