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
#include <type_traits>

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

// Where a lane's x values come from: the token's BF16 row in global memory (XGlobal), or its FP32 copy in
// shared memory (XShared, staged once per CTA by stage_x: float4 group q of chunk c at s[q·nch + c], so
// that the 32 lanes of a load read 32 consecutive float4). Each adds chunk c's products of both rows to ag,
// au: bf16 (8 BF16 weights a row) or mx (16 E4M3 a row and their scale bytes). Both give the same FP32
// values of x, taken in the same order: the same bits.
struct XGlobal {
  const uint8_t* x;
  __device__ __forceinline__ void bf16(uint4 gw, uint4 uw, int c, float& ag, float& au) const {
    const uint4 xv = dev::ldg_v4(x + int64_t(c) * 16);
    ag = dev::dot8_bf16_bf16(gw, xv, ag);
    au = dev::dot8_bf16_bf16(uw, xv, au);
  }
  __device__ __forceinline__ void mx(uint4 gw, uint4 uw, uint32_t gs, uint32_t us, int c, float& ag,
                                     float& au) const {
    const uint4 x0 = dev::ldg_v4(x + int64_t(c) * 32);
    const uint4 x1 = dev::ldg_v4(x + int64_t(c) * 32 + 16);
    ag = fmaf(dev::dot16_e4m3_bf16(gw, x0, x1), dev::e8m0_to_f32(gs), ag);
    au = fmaf(dev::dot16_e4m3_bf16(uw, x0, x1), dev::e8m0_to_f32(us), au);
  }
};
struct XShared {
  const float4* s;
  int nch;             // chunks in the row: H/16 (MXFP8) or H/8 (BF16)
  const float* scale;  // MXFP8: 2^(s-127) for each scale byte s (dev::fill_e8m0_table), in shared memory
  __device__ __forceinline__ void bf16(uint4 gw, uint4 uw, int c, float& ag, float& au) const {
    const float4 h0 = s[c], h1 = s[nch + c];
    ag = dev::dot8_bf16_f32(gw, h0, h1, ag);
    au = dev::dot8_bf16_f32(uw, h0, h1, au);
  }
  __device__ __forceinline__ void mx(uint4 gw, uint4 uw, uint32_t gs, uint32_t us, int c, float& ag,
                                     float& au) const {
    const float4 h[4] = {s[c], s[nch + c], s[2 * nch + c], s[3 * nch + c]};
    ag = fmaf(dev::dot16_e4m3_f32(gw, h), scale[gs], ag);
    au = fmaf(dev::dot16_e4m3_f32(uw, h), scale[us], au);
  }
};

// The CTA's token's x row as FP32 into s (kPer float4 a chunk: 4 for MXFP8 chunks of 16, 2 for BF16 chunks
// of 8), by all threads; the caller synchronises.
template <int kPer>
__device__ __forceinline__ void stage_x(float4* s, const uint16_t* x, int hidden) {
  const int nch = hidden / (4 * kPer), nvec = hidden / 8;
  for (int v = int(threadIdx.x); v < nvec; v += int(blockDim.x)) {
    float4 a, b;
    dev::bf16x8_to_f32(dev::ldg_v4(x + int64_t(v) * 8), a, b);
    const int g = 2 * v;  // float4 groups g, g + 1 (kPer is even)
    s[(g % kPer) * nch + g / kPer] = a;
    s[((g + 1) % kPer) * nch + (g + 1) / kPer] = b;
  }
}

// BF16 weights: chunks of 8 elements; lane sums g and u over its chunks in increasing K. A round is
// kUnroll chunks of both rows, loaded before any is used.
template <int kUnroll>
struct Bf16Round {
  uint4 gw[kUnroll], uw[kUnroll];  // [kUnroll] x 16 B of each row
};

template <int kUnroll>
__device__ __forceinline__ void load_round(Bf16Round<kUnroll>& r, const RowPair& rows, int c0, int nchunks) {
#pragma unroll
  for (int t = 0; t < kUnroll; ++t) {
    const int c = c0 + 32 * t;
    r.gw[t] = make_uint4(0u, 0u, 0u, 0u);
    r.uw[t] = r.gw[t];
    if (c < nchunks) {
      r.gw[t] = dev::ldg_stream_v4(rows.gate + int64_t(c) * 16);
      r.uw[t] = dev::ldg_stream_v4(rows.up + int64_t(c) * 16);
    }
  }
}

template <int kUnroll, class XSrc>
__device__ __forceinline__ void use_round(const Bf16Round<kUnroll>& r, const XSrc& x, int c0, int nchunks,
                                          float& ag, float& au) {
#pragma unroll
  for (int t = 0; t < kUnroll; ++t) {
    const int c = c0 + 32 * t;
    if (c < nchunks) x.bf16(r.gw[t], r.uw[t], c, ag, au);
  }
}

// MXFP8 weights: chunks of 16 E4M3 (half a 32-block, scale byte c/2).
template <int kUnroll>
struct MxRound {
  uint4 gw[kUnroll], uw[kUnroll];  // [kUnroll] x 16 E4M3 of each row
  uint32_t gs[kUnroll], us[kUnroll];
};

template <int kUnroll>
__device__ __forceinline__ void load_round(MxRound<kUnroll>& r, const RowPair& rows, int c0, int nchunks) {
#pragma unroll
  for (int t = 0; t < kUnroll; ++t) {
    const int c = c0 + 32 * t;
    r.gw[t] = make_uint4(0u, 0u, 0u, 0u);
    r.uw[t] = r.gw[t];
    r.gs[t] = 0u;
    r.us[t] = 0u;
    if (c < nchunks) {
      r.gw[t] = dev::ldg_stream_v4(rows.gate + int64_t(c) * 16);
      r.uw[t] = dev::ldg_stream_v4(rows.up + int64_t(c) * 16);
      r.gs[t] = dev::ldg_u8(rows.gate_scales + c / 2);
      r.us[t] = dev::ldg_u8(rows.up_scales + c / 2);
    }
  }
}

template <int kUnroll, class XSrc>
__device__ __forceinline__ void use_round(const MxRound<kUnroll>& r, const XSrc& x, int c0, int nchunks,
                                          float& ag, float& au) {
#pragma unroll
  for (int t = 0; t < kUnroll; ++t) {
    const int c = c0 + 32 * t;
    if (c < nchunks) x.mx(r.gw[t], r.uw[t], r.gs[t], r.us[t], c, ag, au);
  }
}

template <bool kMx, int kUnroll>
using Round = std::conditional_t<kMx, MxRound<kUnroll>, Bf16Round<kUnroll>>;

// Elements of a chunk: 16 E4M3 or 8 BF16 (16 bytes either way).
template <bool kMx>
constexpr int chunk_elems() { return kMx ? 16 : 8; }

// Both rows' dot products with x over the whole row, lane l taking chunks l, l+32, ... in increasing K,
// a round of kUnroll chunks loaded before any is used. kFirstLoaded: the round at chunk `lane` is already
// in `first` (the staged kernel issues it before staging x).
template <bool kMx, int kUnroll, bool kFirstLoaded = false, class XSrc>
__device__ __forceinline__ void dot_rows(const RowPair& rows, const XSrc& x, int hidden, int lane, float& ag,
                                         float& au, const Round<kMx, kUnroll>* first = nullptr) {
  const int nchunks = hidden / chunk_elems<kMx>();
  int c0 = lane;
  if constexpr (kFirstLoaded) {
    use_round<kUnroll>(*first, x, c0, nchunks, ag, au);
    c0 += 32 * kUnroll;
  }
  for (; c0 < nchunks; c0 += 32 * kUnroll) {
    Round<kMx, kUnroll> r;
    load_round<kUnroll>(r, rows, c0, nchunks);
    use_round<kUnroll>(r, x, c0, nchunks, ag, au);
  }
}

// The rows order's blocks: task index t lies in block g = t / kBlock of kBlock adjacent rows; the blocks of
// `pairs` row sets come side by side for each block of rows (g = ig·pairs + pair). Gives the row set `pair`
// and the row i = ig·kBlock + (t - g·kBlock).
template <int kBlock>
__device__ __forceinline__ void rows_block(int64_t t, int64_t pairs, int64_t& pair, int64_t& i) {
  const int64_t g = t / kBlock, ig = g / pairs;
  pair = g - ig * pairs;
  i = ig * kBlock + (t - g * kBlock);
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
  int64_t bj, i;
  rows_block<kBlock>(t, int64_t(p.batch) * p.slots, bj, i);
  return bj * p.inter + i;
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
      rows_block<kBlock>(t, B, b, i);
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
  int64_t bj, i;
  rows_block<kBlock>(u, B * k, bj, i);
  const int64_t b = bj / k, j = bj - b * k;
  return (b * S + j) * I + i;
}

// Whether CTA `cta` (kBlock warps, one task each) holds only shared-expert tasks under p.shared_first:
// those read neither the router's ids nor its weights, only x (complete before the router passed its own
// wait) and the shared weights, so they may start before griddepcontrol.wait.
template <int kBlock>
__device__ __forceinline__ bool shared_first_cta(const GateUpLaunch& p, int64_t cta) {
  return (cta + 1) * kBlock <= int64_t(p.batch) * p.inter;
}

// Task = (b·S + j)·I + i (i fastest) as (b, j, i).
struct TaskPos {
  int b, j, i;
};

__device__ __forceinline__ TaskPos task_pos(const GateUpLaunch& p, int64_t task) {
  TaskPos t;
  t.i = int(task % p.inter);
  const int64_t bj = task / p.inter;
  t.j = int(bj % p.slots);
  t.b = int(bj / p.slots);
  return t;
}

// The lanes' partial sums → the warp's dot products (fixed butterfly), SwiGLU silu(g)·u = (g / (1 +
// e^-g))·u in FP32, one store by lane 0.
template <bool kHBf16>
__device__ __forceinline__ void finish(const GateUpLaunch& p, const TaskPos& t, float ag, float au, int lane) {
  ag = dev::warp_sum(ag);
  au = dev::warp_sum(au);
  if (lane == 0) {
    const float hv = (ag / (1.0f + expf(-ag))) * au;
    const int64_t idx = (int64_t(t.b) * p.slots + t.j) * p.inter + t.i;
    if constexpr (kHBf16) {
      static_cast<uint16_t*>(p.h)[idx] = dev::f32_to_bf16_bits(hv);
    } else {
      static_cast<float*>(p.h)[idx] = hv;
    }
  }
}

// The whole output of task (b·S + j)·I + i: both dot products, SwiGLU, one store. task < B·S·I (caller's
// check); x from global memory.
template <bool kMx, bool kHBf16, int kUnroll>
__device__ __forceinline__ void output(const GateUpLaunch& p, int64_t task, int lane) {
  const TaskPos t = task_pos(p, task);
  const RowPair rows = slot_rows<kMx>(p, t.b, t.j, t.i);
  const XGlobal x{reinterpret_cast<const uint8_t*>(p.x + int64_t(t.b) * p.hidden)};
  float ag = 0.0f, au = 0.0f;
  dot_rows<kMx, kUnroll>(rows, x, p.hidden, lane, ag, au);
  finish<kHBf16>(p, t, ag, au, lane);
}

}  // namespace mxmoe::detail::gate_up
