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

#include "device/cp_async.cuh"
#include "device/ld_st_shared.cuh"
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

// Task = (b·S + j)·I + i (i fastest) as its token, slot and row.
struct Task {
  int b, j, i;
};

__device__ __forceinline__ Task task_parts(const GateUpLaunch& p, int64_t task) {
  const int i = int(task % p.inter);
  const int64_t bj = task / p.inter;
  return Task{int(bj / p.slots), int(bj % p.slots), i};
}

// Lane sums ag, au (each lane's partial dot products) into the output: the fixed warp sum, SwiGLU
// silu(g)·u = (g / (1 + e^-g))·u in FP32, one store by lane 0.
template <bool kHBf16>
__device__ __forceinline__ void finish(const GateUpLaunch& p, const Task& t, float ag, float au, int lane) {
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

// The whole output of task (task < B·S·I, caller's check): both dot products, then finish().
template <bool kMx, bool kHBf16, int kUnroll>
__device__ __forceinline__ void output(const GateUpLaunch& p, int64_t task, int lane) {
  const Task t = task_parts(p, task);
  const RowPair rows = slot_rows<kMx>(p, t.b, t.j, t.i);
  const uint8_t* x = reinterpret_cast<const uint8_t*>(p.x + int64_t(t.b) * p.hidden);
  float ag = 0.0f, au = 0.0f;
  if constexpr (kMx) {
    dot_rows_mx<kUnroll>(rows, x, p.hidden, lane, ag, au);
  } else {
    dot_rows_bf16<kUnroll>(rows, x, p.hidden, lane, ag, au);
  }
  finish<kHBf16>(p, t, ag, au, lane);
}

// The asynchronous-copy walk (MXMOE_DECODE_GATE_UP_ASYNC = kDepth; session 18). Why: ncu (run 133)
// has the MXFP8 kernel between an issue and a latency limit: a warp loads kUnroll chunks into
// registers, then converts them, and has nothing in flight while it converts. Here each lane copies
// its chunks with cp.async into its own slots of a ring of kDepth stages in shared memory (a stage:
// the lane's chunk c of the gate row and of the up row, and for MXFP8 the aligned 4-byte words that
// hold their scale bytes) and keeps kDepth - 1 stages in flight while it computes, across the rows
// of one task and on into its next task (a warp walks tasks first, first + stride, ...). A lane
// reads only what it copied itself, so cp.async.wait_group is the only synchronisation. The
// arithmetic is output()'s in the same order: the same bits.
// Shared memory a warp: kDepth stages x (2 rows x 32 lanes x 16 B, + MXFP8 2 x 32 x 4 B).
template <bool kMx>
constexpr int async_stage_bytes() {
  return 2 * 32 * 16 + (kMx ? 2 * 32 * 4 : 0);
}

template <bool kMx, bool kHBf16, int kDepth, int kBlock>
__device__ __forceinline__ void walk_async(const GateUpLaunch& p, int64_t first, int64_t stride, int lane,
                                           uint8_t* ring) {
  constexpr int kElems = kMx ? 16 : 8;  // elements a 16-byte chunk
  const int64_t total = int64_t(p.batch) * p.slots * p.inter;
  const int nchunks = p.hidden / kElems;
  const int rounds = (nchunks + 31) / 32;  // stages a task
  uint8_t* const wts = ring;                                // [kDepth][2][32] x 16 B
  uint8_t* const scl = ring + kDepth * 2 * 32 * 16;         // [kDepth][2][32] x 4 B (MXFP8)
  const uint32_t wts_s = uint32_t(__cvta_generic_to_shared(wts)), scl_s = uint32_t(__cvta_generic_to_shared(scl));

  // Issue side: the next stage to copy is round ir of the task numbered it (rows ip).
  int64_t it = first;
  int ir = 0, islot = 0;
  RowPair ip{};
  if (it < total) {
    const Task t = task_parts(p, task_of<kBlock>(p, it));
    ip = slot_rows<kMx>(p, t.b, t.j, t.i);
  }
  auto issue = [&]() {
    if (it < total) {
      const int c = lane + 32 * ir;
      if (c < nchunks) {
        uint8_t* w = wts + (islot * 2) * 512 + lane * 16;
        dev::cp_async_cg_shared_global_16_zfill(w, ip.gate + int64_t(c) * 16, true);
        dev::cp_async_cg_shared_global_16_zfill(w + 512, ip.up + int64_t(c) * 16, true);
        if constexpr (kMx) {
          // The aligned word that holds the scale byte (it lies in the same page as that byte).
          uint8_t* s = scl + (islot * 2) * 128 + lane * 4;
          const uintptr_t g = reinterpret_cast<uintptr_t>(ip.gate_scales + c / 2) & ~uintptr_t(3);
          const uintptr_t u = reinterpret_cast<uintptr_t>(ip.up_scales + c / 2) & ~uintptr_t(3);
          dev::cp_async_ca_shared_global_4_zfill(s, reinterpret_cast<const void*>(g), true);
          dev::cp_async_ca_shared_global_4_zfill(s + 128, reinterpret_cast<const void*>(u), true);
        }
      }
      if (++ir == rounds) {
        ir = 0;
        it += stride;
        if (it < total) {
          const Task t = task_parts(p, task_of<kBlock>(p, it));
          ip = slot_rows<kMx>(p, t.b, t.j, t.i);
        }
      }
    }
    dev::cp_async_commit_group();  // every call commits a group (maybe empty): the wait count holds
    islot = islot + 1 == kDepth ? 0 : islot + 1;
  };

#pragma unroll 1
  for (int d = 0; d < kDepth - 1; ++d) issue();
  int cslot = 0;
#pragma unroll 1
  for (int64_t ct = first; ct < total; ct += stride) {
    const Task t = task_parts(p, task_of<kBlock>(p, ct));
    const uint8_t* x = reinterpret_cast<const uint8_t*>(p.x + int64_t(t.b) * p.hidden);
    uint32_t gsh = 0, ush = 0;  // low address bits of the scale rows: the byte's place in its word
    if constexpr (kMx) {
      const RowPair rows = slot_rows<kMx>(p, t.b, t.j, t.i);
      gsh = uint32_t(reinterpret_cast<uintptr_t>(rows.gate_scales));
      ush = uint32_t(reinterpret_cast<uintptr_t>(rows.up_scales));
    }
    float ag = 0.0f, au = 0.0f;
#pragma unroll 1
    for (int r = 0; r < rounds; ++r) {
      issue();
      dev::cp_async_wait_group<kDepth - 1>();  // this lane's stage cslot has landed
      const int c = lane + 32 * r;
      if (c < nchunks) {
        const uint32_t w = wts_s + uint32_t((cslot * 2) * 512 + lane * 16);
        const uint4 gw = device::ld_shared_v4_u32(w), uw = device::ld_shared_v4_u32(w + 512);
        if constexpr (kMx) {
          const uint32_t s = scl_s + uint32_t((cslot * 2) * 128 + lane * 4);
          const uint32_t gword = device::ld_shared_u32(s), uword = device::ld_shared_u32(s + 128);
          const uint32_t gs = (gword >> (8 * ((gsh + uint32_t(c / 2)) & 3u))) & 0xFFu;
          const uint32_t us = (uword >> (8 * ((ush + uint32_t(c / 2)) & 3u))) & 0xFFu;
          const uint4 x0 = dev::ldg_v4(x + int64_t(c) * 32);
          const uint4 x1 = dev::ldg_v4(x + int64_t(c) * 32 + 16);
          ag = fmaf(dev::dot16_e4m3_bf16(gw, x0, x1), dev::e8m0_to_f32(gs), ag);
          au = fmaf(dev::dot16_e4m3_bf16(uw, x0, x1), dev::e8m0_to_f32(us), au);
        } else {
          const uint4 xv = dev::ldg_v4(x + int64_t(c) * 16);
          ag = dev::dot8_bf16_bf16(gw, xv, ag);
          au = dev::dot8_bf16_bf16(uw, xv, au);
        }
      }
      cslot = cslot + 1 == kDepth ? 0 : cslot + 1;
    }
    finish<kHBf16>(p, t, ag, au, lane);
  }
  dev::cp_async_wait_group<0>();  // nothing left in flight into shared memory at exit
}

}  // namespace mxmoe::detail::gate_up
