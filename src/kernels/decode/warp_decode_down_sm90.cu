// Warp decode, down projection with the routing-weighted sum (DESIGN.md §4, decode.h):
//   out[b, n] = Σ_{j=0..S-1} w[b, j] · (h[b, j] · W2[e_j][n]),   w[b, k] = 1 for the shared expert
//   h FP32 or BF16 [B, S, I] (16-byte aligned); W2 [E, H, I] BF16, or MXFP8 data E4M3 [E, H, I]
//   + scales E8M0 [E, H, I/32]; shared W2s [H, I]; ids int32 [B, k]; w FP32 [B, k];
//   out BF16 [B, H].
// One CTA owns kRows = 4 adjacent outputs n of one token b. Its W = min(S, 16) warps split the
// slots (warp w takes j = w, w+W, ...); for each slot a warp streams the kRows rows of length I
// (I = 768 rows are short: several rows give each lane kUnroll·kRows = 8 independent 16-byte loads,
// 4 KB a warp, before any is used), each lane summing its chunks in increasing K, then the fixed
// xor butterfly. The per-slot dot products meet in shared memory and one thread per output adds
// them in slot order j = 0..S-1 (acc = fma(w_j, dot_j, acc), FP32), then rounds to BF16 once.
// No atomics; the order depends on nothing but (b, n), so the result is batch-invariant.
// Programmatic Dependent Launch (src/host/pdl_launch.h): before griddepcontrol.wait, lane 0 of each
// warp reads its slots' expert ids and asks L2 for the kRows weight rows (cp.async.bulk.prefetch.L2,
// no registers), so that weight streaming overlaps the tail of decode_gate_up. That read is a hint
// only: in the decode step the ids are final by then (the router finished before decode_gate_up
// passed its griddepcontrol.wait, which precedes its launch_dependents), and should they not be, a
// clamped id prefetches other rows of the same tensor. Everything the result depends on (ids, h,
// routing weights) is read, and out written, after the wait.
// Registers: ~60-90 a thread (-Xptxas -v, no spills). Shared: (kDecodeMaxTopK+1)·kRows·4 B.
// Roofline: 2·H·I FLOPs per (token, slot); bytes H·I·(2 | 1 + 1/32) per distinct expert.
// Tests: tests/gpu/test_decode_gpu.cpp. Bench: bench/bench_decode.py.
#include <cstdint>

#include "device/cp_async_bulk_prefetch.cuh"
#include "device/griddepcontrol.cuh"
#include "host/check.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_common.cuh"
#include "mxmoe/decode.h"

namespace mxmoe::detail {
namespace {

constexpr int kRows = 4;       // outputs per CTA (rows of W2 per warp and slot)
constexpr int kUnroll = 2;     // chunks of each row in flight per lane
constexpr int kMaxWarps = 16;  // warps per CTA: min(S, kMaxWarps)
constexpr int kMaxSlots = kDecodeMaxTopK + 1;

static_assert(8 % kRows == 0, "H % 8 == 0 (host check), so a CTA's kRows rows all lie below H");

// The kRows rows n0 .. n0+kRows-1 of slot j's W2 block: row q at row + q·row_bytes.
struct SlotRows {
  const uint8_t* row;
  const uint8_t* scales;  // MXFP8: scale row of row n0; row q at scales + q·scale_row
  int64_t row_bytes, scale_row;
};

template <bool kMx>
__device__ __forceinline__ SlotRows slot_rows(const DownLaunch& p, int b, int j, int n0) {
  SlotRows r;
  r.row_bytes = kMx ? int64_t(p.inter) : 2 * int64_t(p.inter);
  r.scale_row = p.inter / kMxBlock;
  const uint8_t* w;
  const uint8_t* s = nullptr;
  if (j < p.top_k) {
    const int64_t e = dev::clamp_expert(p.ids[int64_t(b) * p.top_k + j], p.num_experts);
    w = static_cast<const uint8_t*>(p.w2.data) + e * p.hidden * r.row_bytes;
    if (kMx) s = p.w2.scales + e * p.hidden * r.scale_row;
  } else {
    w = static_cast<const uint8_t*>(p.w2.shared_data);
    if (kMx) s = p.w2.shared_scales;
  }
  r.row = w + int64_t(n0) * r.row_bytes;
  r.scales = kMx ? s + int64_t(n0) * r.scale_row : nullptr;
  return r;
}

// Eight h values (elements 8c .. 8c+7) as FP32.
template <bool kHBf16>
__device__ __forceinline__ void load_h8(const void* h_row, int c, float4& a, float4& b) {
  if constexpr (kHBf16) {
    dev::bf16x8_to_f32(dev::ldg_v4(static_cast<const uint8_t*>(h_row) + int64_t(c) * 16), a, b);
  } else {
    const uint8_t* p = static_cast<const uint8_t*>(h_row) + int64_t(c) * 32;
    a = dev::as_float4(dev::ldg_v4(p));
    b = dev::as_float4(dev::ldg_v4(p + 16));
  }
}

// BF16 weights: chunks of 8.
template <bool kHBf16>
__device__ __forceinline__ void dot_rows_bf16(const SlotRows& r, const void* h_row, int inter,
                                              int lane, float (&acc)[kRows]) {
  const int nchunks = inter / 8;
  for (int c0 = lane; c0 < nchunks; c0 += 32 * kUnroll) {
    uint4 w[kUnroll][kRows];  // 16 B of each row per chunk
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
#pragma unroll
      for (int q = 0; q < kRows; ++q) {
        w[t][q] = make_uint4(0u, 0u, 0u, 0u);
        if (c < nchunks) w[t][q] = dev::ldg_stream_v4(r.row + q * r.row_bytes + int64_t(c) * 16);
      }
    }
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      if (c < nchunks) {
        float4 h0, h1;
        load_h8<kHBf16>(h_row, c, h0, h1);
#pragma unroll
        for (int q = 0; q < kRows; ++q) acc[q] = dev::dot8_bf16_f32(w[t][q], h0, h1, acc[q]);
      }
    }
  }
}

// MXFP8 weights: chunks of 16 E4M3 (scale byte c/2); chunk sum from 0, then exact scaling.
template <bool kHBf16>
__device__ __forceinline__ void dot_rows_mx(const SlotRows& r, const void* h_row, int inter,
                                            int lane, float (&acc)[kRows]) {
  const int nchunks = inter / 16;
  for (int c0 = lane; c0 < nchunks; c0 += 32 * kUnroll) {
    uint4 w[kUnroll][kRows];  // 16 E4M3 of each row per chunk
    uint32_t s[kUnroll][kRows];
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
#pragma unroll
      for (int q = 0; q < kRows; ++q) {
        w[t][q] = make_uint4(0u, 0u, 0u, 0u);
        s[t][q] = 0u;
        if (c < nchunks) {
          w[t][q] = dev::ldg_stream_v4(r.row + q * r.row_bytes + int64_t(c) * 16);
          s[t][q] = dev::ldg_u8(r.scales + q * r.scale_row + c / 2);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      if (c < nchunks) {
        float4 h[4];
        load_h8<kHBf16>(h_row, 2 * c, h[0], h[1]);
        load_h8<kHBf16>(h_row, 2 * c + 1, h[2], h[3]);
#pragma unroll
        for (int q = 0; q < kRows; ++q)
          acc[q] = fmaf(dev::dot16_e4m3_f32(w[t][q], h), dev::e8m0_to_f32(s[t][q]), acc[q]);
      }
    }
  }
}

template <bool kMx, bool kHBf16>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) warp_decode_down_kernel(const DownLaunch p) {
  __shared__ float s_dot[kMaxSlots][kRows];  // per-slot dot products of this CTA's outputs
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  const int tiles = (p.hidden + kRows - 1) / kRows;
  const int b = int(blockIdx.x / unsigned(tiles));
  const int n0 = int(blockIdx.x % unsigned(tiles)) * kRows;
  const size_t h_elem = kHBf16 ? 2 : 4;

  // Before the wait: an L2 prefetch of this warp's weight rows, a hint only (see the header).
  if (lane == 0) {
    for (int j = warp; j < p.slots; j += num_warps) {
      const SlotRows rows = slot_rows<kMx>(p, b, j, n0);
      device::cp_async_bulk_prefetch_L2_global(rows.row, uint32_t(kRows * rows.row_bytes));
    }
  }
  device::griddepcontrol_wait();  // h comes from decode_gate_up (the kernel ahead of this one)
  device::griddepcontrol_launch_dependents();

  for (int j = warp; j < p.slots; j += num_warps) {
    const SlotRows rows = slot_rows<kMx>(p, b, j, n0);
    const void* h_row = static_cast<const uint8_t*>(p.h) +
                        ((int64_t(b) * p.slots + j) * p.inter) * int64_t(h_elem);
    float acc[kRows];
#pragma unroll
    for (int q = 0; q < kRows; ++q) acc[q] = 0.0f;
    if constexpr (kMx) {
      dot_rows_mx<kHBf16>(rows, h_row, p.inter, lane, acc);
    } else {
      dot_rows_bf16<kHBf16>(rows, h_row, p.inter, lane, acc);
    }
#pragma unroll
    for (int q = 0; q < kRows; ++q) acc[q] = dev::warp_sum(acc[q]);
    if (lane == 0) {
#pragma unroll
      for (int q = 0; q < kRows; ++q) s_dot[j][q] = acc[q];
    }
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int q = threadIdx.x, n = n0 + q;
    if (n < p.hidden) {
      float out = 0.0f;
      for (int j = 0; j < p.slots; ++j) {
        const float wj = j < p.top_k ? p.weights[int64_t(b) * p.top_k + j] : 1.0f;
        out = fmaf(wj, s_dot[j][q], out);
      }
      p.out[int64_t(b) * p.hidden + n] = dev::f32_to_bf16_bits(out);
    }
  }
}

template <bool kMx, bool kHBf16>
void launch(const DownLaunch& p, cudaStream_t stream) {
  const int64_t tiles = (p.hidden + kRows - 1) / kRows;
  const int warps = p.slots < kMaxWarps ? p.slots : kMaxWarps;
  launch_with_pdl("decode_down", warp_decode_down_kernel<kMx, kHBf16>,
                  dim3(unsigned(int64_t(p.batch) * tiles)), dim3(warps * 32), 0, stream, p);
}

}  // namespace

void launch_decode_down(const DownLaunch& p, cudaStream_t stream) {
  if (p.w2.mxfp8) {
    if (p.h_bf16) launch<true, true>(p, stream); else launch<true, false>(p, stream);
  } else {
    if (p.h_bf16) launch<false, true>(p, stream); else launch<false, false>(p, stream);
  }
  MXMOE_CHECK_LAUNCH("decode_down");
}

}  // namespace mxmoe::detail
