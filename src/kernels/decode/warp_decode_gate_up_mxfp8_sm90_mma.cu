// Warp decode, gate/up projection with SwiGLU, MXFP8 weights, on the tensor cores (DESIGN.md §4,
// include/mxmoe/decode.h):
//   h[b, j, i] = silu(g) · u,  g = X[b]·W1[e_j][i],  u = X[b]·W1[e_j][I + i],  silu(g) = g/(1+e^-g)
//   X BF16 [B, H] (16-byte aligned); W1 data E4M3 [E, 2I, H] (16-byte aligned) + scales E8M0
//   [E, 2I, H/32]; shared expert W1s [2I, H] + [2I, H/32] as slot j = k; ids int32 [B, k];
//   h FP32 or BF16 [B, S, I]. H % 32 == 0, I % 32 == 0 (host checks).
//
// Work: a CTA owns kOutputs = 8 outputs i0..i0+7 of one (token b, slot j). Its 16 weight rows,
// gate rows i0+r and up rows I+i0+r (r < 8), are the A operand (16 x K) of m16n8k16 mma.sync, FP16
// x FP16 → FP32. The kWarps = 8 warps split K: warp w takes MX blocks [w·nb/8, (w+1)·nb/8)
// (nb = H/32), in groups of kGroup = 8 blocks.
//
// A group, lane l (g = l/4, t = l%4): for each block n of the group, 8 bytes of gate row g and of
// up row g (bytes 8t..8t+7 of the block, LDG.64 without L1 allocation): A of the block's two k16
// steps (elements 8t+4s..8t+4s+3 of step s fill A's k-slots 2t, 2t+1, 2t+8, 2t+9), E4M3 → FP16 by
// one F2FP per pair (exact). B column n holds block n's x and zeros: lane (g, t) converts the 8 x
// of block g (elements 8t..8t+7) to FP16 once per group and passes them to the mmas of block
// n = g, zeros to the others. After the group's 16 mmas (one FP32 accumulator chain, from 0),
// D[r][n] is block n's sum of exact products for row r; lane (g, t) holds blocks 2t, 2t+1 of gate
// row g (d0, d1) and up row g (d2, d3) and adds each times its block scale into FP32 accumulators
// (exact power-of-two scaling). The 4 lanes of a quad are then summed (xor 1, 2), the 8 warps in
// shared memory in warp order; 8 threads apply SwiGLU and store.
//
// Exact FP16 x: X is BF16 (8-bit significand). Before its first mma a warp scans its slice of x
// (the values it will convert): with amax = max |x| = 2^E·1.m, x' = x·2^(15−E) is < 2^16 and every
// x with |x| >= 2^(E−32) (or x = 0) is an FP16 value exactly (lsb >= 2^−24). If the slice holds
// an element below that, an Inf/NaN, or |x| < 2^−111 throughout, the warp takes the exact FP32
// path instead (dot_fallback: E4M3 → FP32, FFMA, same loads): same contract, slower, rare. The
// warp's partial is multiplied by 2^(E−15) at the end (exact unless it over/underflows).
//
// Numerics: exact products (E4M3·BF16 in FP16·FP16); per block the tensor core's FP32-width sum
// of 32 products (two chained mmas; the other blocks' mmas add exact zeros); per lane an FP32 FMA
// chain over its blocks in increasing K; then a fixed butterfly, a fixed warp order, SwiGLU in
// FP32. Every order depends on (b, j, i) only: deterministic and batch-invariant.
//
// Registers: 78 a thread (-Xptxas -v, no spills; a group's weights are 32 of them): 3 CTAs
// (24 warps, 96 KB of weights in flight) a SM. The partial group is kept out of the loop: with it
// inside, ptxas needed 109 registers. Shared: 512 B. SASS: 209 instructions a lane per whole group
// (128 weight bytes), 1.63 per byte (docs/notes/decode.md, "Session 6").
// Roofline: 2·2·I·H FLOPs per (token, slot); bytes 2·I·H·(1 + 1/32) per distinct expert.
// Tests: tests/gpu/test_decode_gpu.cpp (DecodeGpu.*, incl. MxGateUpWideRangeX for the exact
// fallback). Bench: bench/bench_decode.py.
#include <cstdint>

#include "device/griddepcontrol.cuh"
#include "device/mma_sync.cuh"
#include "host/check.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_common.cuh"

namespace mxmoe::detail {
namespace {

constexpr int kWarps = 8;               // K split: warps per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kOutputs = 8;             // outputs per CTA: gate + up rows = one m16 tile
constexpr int kGroup = 8;               // MX blocks per group = columns of B
constexpr int kBlockBytes = 32;         // one MX block of E4M3
static_assert(kOutputs * 2 == 16 && kGroup == 8, "m16n8k16: 16 rows of A, 8 columns of B");
static_assert(kMxBlock == kBlockBytes, "MX blocks of 32 one-byte codes");

// This lane's two rows (gate row i0+g, up row I+i0+g) at byte 8t, and their scale rows, all at
// MX block kb (advanced a group at a time), and its x: block kb+g, elements 8t..8t+7.
struct LanePtrs {
  const uint8_t* gate;
  const uint8_t* up;
  const uint8_t* gate_scales;
  const uint8_t* up_scales;
  const uint8_t* x;
  __device__ __forceinline__ void advance(int blocks) {
    gate += blocks * kBlockBytes;
    up += blocks * kBlockBytes;
    gate_scales += blocks;
    up_scales += blocks;
    x += blocks * 64;
  }
};

__device__ __forceinline__ LanePtrs lane_ptrs(const GateUpLaunch& p, int b, int j, int i0, int kb, int lane) {
  const int64_t H = p.hidden, I = p.inter, nb = H / kMxBlock;
  const uint8_t* w;
  const uint8_t* s;
  if (j < p.top_k) {
    const int64_t e = dev::clamp_expert(p.ids[int64_t(b) * p.top_k + j], p.num_experts);
    w = static_cast<const uint8_t*>(p.w1.data) + e * 2 * I * H;
    s = p.w1.scales + e * 2 * I * nb;
  } else {
    w = static_cast<const uint8_t*>(p.w1.shared_data);
    s = p.w1.shared_scales;
  }
  const int64_t g = lane >> 2, t = lane & 3;
  LanePtrs r;
  r.gate = w + (i0 + g) * H + int64_t(kb) * kBlockBytes + 8 * t;
  r.up = w + (I + i0 + g) * H + int64_t(kb) * kBlockBytes + 8 * t;
  r.gate_scales = s + (i0 + g) * nb + kb;
  r.up_scales = s + (I + i0 + g) * nb + kb;
  r.x = reinterpret_cast<const uint8_t*>(p.x + int64_t(b) * H) + (kb + g) * 64 + 16 * t;
  return r;
}

// The scale window of a warp's x slice (see the header): x' = x·xmul is exact in FP16, and the
// warp's partial is multiplied by unscale.
struct XWindow {
  bool exact;
  float xmul, unscale;
};

// Max |x| (BF16 bits) and min nonzero |x| over the x values this lane converts (block kb+g of
// each group, elements 8t..8t+7), then over the warp. Packed per 16-bit half: amax by u16 max of
// the magnitudes; min nonzero by s16 min of (v | 0x8000) − 1, which maps v >= 1 to −32768 + v − 1
// (increasing in v) and v = 0 to +32767 (never the min).
__device__ __forceinline__ XWindow x_window(const uint8_t* x, int blocks, int g) {
  uint32_t amax2 = 0u, zmin2 = 0x7FFF7FFFu;
  for (int kb = 0; kb < blocks; kb += kGroup) {
    if (kb + g < blocks) {
      const uint4 v = dev::ldg_v4(x + int64_t(kb) * 64);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        amax2 = __vmaxu2(amax2, w[i] & 0x7FFF7FFFu);
        zmin2 = __vmins2(zmin2, (w[i] | 0x80008000u) - 0x00010001u);
      }
    }
  }
  uint32_t amax = max(amax2 & 0xFFFFu, amax2 >> 16);
  int32_t zmin = min(int32_t(int16_t(zmin2 & 0xFFFFu)), int32_t(int16_t(zmin2 >> 16)));
  amax = __reduce_max_sync(dev::kFullMask, amax);
  zmin = __reduce_min_sync(dev::kFullMask, zmin);
  XWindow win{true, 1.0f, 1.0f};
  if (amax == 0u) return win;  // all zero: x' = x
  const int e8 = int(amax >> 7);         // biased exponent of max |x|
  const int vmin = zmin + 32769;         // min nonzero |x| bits (65536: none)
  const int lo = e8 > 32 ? (e8 - 32) << 7 : 0;
  win.exact = amax < 0x7F80u && e8 >= 16 && vmin >= lo;
  win.xmul = __uint_as_float(uint32_t(269 - e8) << 23);    // 2^(142 − e8) = 2^(15 − E)
  win.unscale = __uint_as_float(uint32_t(e8 - 15) << 23);  // 2^(e8 − 142)
  return win;
}

// One group's weights and scales in registers.
struct Group {
  uint2 gate[kGroup], up[kGroup];  // [kGroup] x 8 E4M3 of each row (bytes 8t..8t+7 of block n)
  uint32_t gs0, gs1, us0, us1;     // scale bytes of blocks 2t, 2t+1 (gate, up)
  bool s0_ok, s1_ok;               // blocks 2t, 2t+1 lie inside the group
};

template <bool kFull>
__device__ __forceinline__ void load_group(Group& q, const LanePtrs& r, int nblk, int t) {
#pragma unroll
  for (int n = 0; n < kGroup; ++n) {
    q.gate[n] = make_uint2(0u, 0u);
    q.up[n] = q.gate[n];
    if (kFull || n < nblk) {
      q.gate[n] = dev::ldg_stream_v2(r.gate + n * kBlockBytes);
      q.up[n] = dev::ldg_stream_v2(r.up + n * kBlockBytes);
    }
  }
  q.s0_ok = kFull || 2 * t < nblk;
  q.s1_ok = kFull || 2 * t + 1 < nblk;
  q.gs0 = q.gs1 = q.us0 = q.us1 = 0u;
  if (q.s0_ok) {
    q.gs0 = dev::ldg_u8(r.gate_scales + 2 * t);
    q.us0 = dev::ldg_u8(r.up_scales + 2 * t);
  }
  if (q.s1_ok) {
    q.gs1 = dev::ldg_u8(r.gate_scales + 2 * t + 1);
    q.us1 = dev::ldg_u8(r.up_scales + 2 * t + 1);
  }
}

// The group's 16 mmas and the scaled accumulation (see the header).
template <bool kFull>
__device__ __forceinline__ void mma_group(const Group& q, const LanePtrs& r, int nblk, int g,
                                          float xmul, float& acc_g, float& acc_u) {
  uint4 xv = make_uint4(0u, 0u, 0u, 0u);
  if (kFull || g < nblk) xv = dev::ldg_v4(r.x);
  const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
  uint32_t xh[4];  // x of block g, elements 8t..8t+7, FP16 pairs (exact: x_window)
#pragma unroll
  for (int i = 0; i < 4; ++i)
    xh[i] = dev::f16x2_from_f32_rn(dev::bf16_lo(xw[i]) * xmul, dev::bf16_hi(xw[i]) * xmul);
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < kGroup; ++n) {
    if (kFull || n < nblk) {
      const bool mine = g == n;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const uint32_t wg = s ? q.gate[n].y : q.gate[n].x, wu = s ? q.up[n].y : q.up[n].x;
        const uint32_t a[4] = {dev::f16x2_from_e4m3x2_lo(wg), dev::f16x2_from_e4m3x2_lo(wu),
                               dev::f16x2_from_e4m3x2_hi(wg), dev::f16x2_from_e4m3x2_hi(wu)};
        dev::mma_sync_aligned_m16n8k16_row_col_f32_f16_f16_f32(d, a, mine ? xh[2 * s] : 0u,
                                                               mine ? xh[2 * s + 1] : 0u, d);
      }
    }
  }
  const bool ok0 = kFull || q.s0_ok, ok1 = kFull || q.s1_ok;  // blocks 2t, 2t+1 in the group
  const float sg0 = ok0 ? dev::e8m0_to_f32(q.gs0) : 0.0f, su0 = ok0 ? dev::e8m0_to_f32(q.us0) : 0.0f;
  const float sg1 = ok1 ? dev::e8m0_to_f32(q.gs1) : 0.0f, su1 = ok1 ? dev::e8m0_to_f32(q.us1) : 0.0f;
  acc_g = fmaf(d[0], sg0, acc_g);
  acc_g = fmaf(d[1], sg1, acc_g);
  acc_u = fmaf(d[2], su0, acc_u);
  acc_u = fmaf(d[3], su1, acc_u);
}

// Exact FP32 path for a warp whose x slice does not fit one FP16 window: per block, this lane's
// 8 products of each row (E4M3 → FP32, FFMA from 0 in increasing K), then times the block scale.
// The lane sums the blocks of its slice in increasing K; the caller's quad butterfly adds the 4
// lanes (bytes 8t..8t+7 of every block).
__device__ __forceinline__ void dot_fallback(const LanePtrs& r, int g, int blocks, float& acc_g,
                                             float& acc_u) {
  const uint8_t* x = r.x - g * 64;  // block 0 of the slice
  for (int kb = 0; kb < blocks; ++kb) {
    const uint2 wg = dev::ldg_stream_v2(r.gate + kb * kBlockBytes);
    const uint2 wu = dev::ldg_stream_v2(r.up + kb * kBlockBytes);
    const uint4 xv = dev::ldg_v4(x + kb * 64);
    acc_g = fmaf(dev::dot8_e4m3_bf16(wg, xv, 0.0f), dev::e8m0_to_f32(dev::ldg_u8(r.gate_scales + kb)), acc_g);
    acc_u = fmaf(dev::dot8_e4m3_bf16(wu, xv, 0.0f), dev::e8m0_to_f32(dev::ldg_u8(r.up_scales + kb)), acc_u);
  }
}

template <bool kHBf16>
__global__ void __launch_bounds__(kThreads) warp_decode_gate_up_mxfp8_kernel(const GateUpLaunch p) {
  __shared__ float s_part[kWarps][kOutputs][2];  // per-warp partial (gate, up) of each output
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tiles = p.inter / kOutputs;
  const int tile = int(blockIdx.x % unsigned(tiles));
  const int bj = int(blockIdx.x / unsigned(tiles));
  const int j = bj % p.slots, b = bj / p.slots;
  const int i0 = tile * kOutputs;
  const int nb = p.hidden / kMxBlock;
  const int kb0 = warp * nb / kWarps, kb1 = (warp + 1) * nb / kWarps;  // this warp's MX blocks
  const int g = lane >> 2, t = lane & 3;

  dev::griddepcontrol_wait();  // ids come from the router (the kernel ahead of this one)
  dev::griddepcontrol_launch_dependents();

  float acc_g = 0.0f, acc_u = 0.0f, unscale = 1.0f;
  const int blocks = kb1 - kb0;
  if (blocks > 0) {
    LanePtrs r = lane_ptrs(p, b, j, i0, kb0, lane);
    Group q;
    const int full = blocks / kGroup, tail = blocks % kGroup;  // whole groups, then one partial
    if (full > 0) load_group<true>(q, r, kGroup, t); else load_group<false>(q, r, tail, t);
    const XWindow win = x_window(r.x, blocks, g);  // while the first group's loads fly
    if (win.exact) {
      unscale = win.unscale;
      for (int gi = 0; gi < full; ++gi) {
        if (gi > 0) load_group<true>(q, r, kGroup, t);
        mma_group<true>(q, r, kGroup, g, win.xmul, acc_g, acc_u);
        r.advance(kGroup);
      }
      if (tail > 0) {
        if (full > 0) load_group<false>(q, r, tail, t);
        mma_group<false>(q, r, tail, g, win.xmul, acc_g, acc_u);
      }
    } else {
      dot_fallback(r, g, blocks, acc_g, acc_u);
    }
  }
  // The quad's 4 lanes (fixed butterfly), then the warp's exact rescale.
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    acc_g += __shfl_xor_sync(dev::kFullMask, acc_g, o);
    acc_u += __shfl_xor_sync(dev::kFullMask, acc_u, o);
  }
  if (t == 0) {
    s_part[warp][g][0] = acc_g * unscale;
    s_part[warp][g][1] = acc_u * unscale;
  }
  __syncthreads();
  if (threadIdx.x < kOutputs) {
    const int r = threadIdx.x;
    float gs = 0.0f, us = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      gs += s_part[w][r][0];
      us += s_part[w][r][1];
    }
    dev::store_swiglu<kHBf16>(p.h, (int64_t(b) * p.slots + j) * p.inter + i0 + r, gs, us);
  }
}

template <bool kHBf16>
void launch(const GateUpLaunch& p, cudaStream_t stream) {
  const int64_t blocks = int64_t(p.batch) * p.slots * (p.inter / kOutputs);
  launch_with_pdl("decode_gate_up", warp_decode_gate_up_mxfp8_kernel<kHBf16>, dim3(unsigned(blocks)),
                  dim3(kThreads), 0, stream, p);
}

}  // namespace

void launch_decode_gate_up_mxfp8(const GateUpLaunch& p, cudaStream_t stream) {
  if (p.h_bf16) launch<true>(p, stream); else launch<false>(p, stream);
  MXMOE_CHECK_LAUNCH("decode_gate_up");
}

}  // namespace mxmoe::detail
